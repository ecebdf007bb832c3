"""What the planner predicts for a run, fitted from what the control plane stored, and how
another run's measurement compares with it.

    table, why = plan_for_run(run)      # engine.api.plan_run over its MetricPoint and
                                        # PhaseSpan rows; (None, reason) when it cannot fit
    {% include "jobs/_plan_table.html" with plan=table plan_error=why %}
    checks = predicted_vs_measured(table, run, others)  # per run: its row of the table
                                        # against its own median samples/s and bubble

The fork page shows the parent's table; the compare page the baseline's, with the checks.
BubbleHigh's runbook asks jobs.alerts.whatif, which reads no database, from the history.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from engine.api import metrics as M
from engine.config import ConfigError
from jobs.alerts.whatif import plan_history
from jobs.models import MetricPoint, NotNative, PhaseSpan, Run

PLAN_STEPS = 51          # the latest steps fitted (the planner leaves the first one out)
# What the planner's costs are per: a run that differs here is not the predicted workload.
WORKLOAD = (("rollout", "prompts_per_step"), ("algorithm", "group_size"),
            ("rollout", "max_new_tokens"))


def timed_steps(run: Run) -> list[int]:
    """The latest PLAN_STEPS steps that reported time/step_s, oldest first."""
    return sorted(MetricPoint.objects.filter(run=run, name=M.TIME_STEP_S)
                  .order_by("-step").values_list("step", flat=True)[:PLAN_STEPS])


def plan_for_run(run: Run, devices: int | None = None):
    """(engine PlanTable, "") or (None, why it cannot be planned)."""
    try:
        cfg = run.run_config
    except ConfigError as exc:
        return None, f"its stored config no longer validates: {exc}"
    except NotNative as exc:
        return None, str(exc)
    steps = timed_steps(run)
    if not steps:
        return None, "it has no timed step yet"
    first = steps[0]
    metrics: dict[str, dict[int, float]] = {}
    for name, step, value in (MetricPoint.objects.filter(run=run, step__gte=first)
                              .values_list("name", "step", "value")):
        if value is not None:
            metrics.setdefault(name, {})[step] = value
    spans = PhaseSpan.objects.filter(run=run, step__gte=first).only(
        "device", "phase", "start", "end", "step")
    return plan_history(cfg, metrics, spans, devices)


@dataclass
class Check:
    """One run's measurement next to the baseline's prediction for its placement and
    policy; ``row`` None and ``why`` set when there is nothing to set side by side."""

    run: Run
    row: object = None                     # engine Prediction
    samples_per_s: float | None = None     # measured, median over the steps a fit uses
    bubble: float | None = None            # measured median; None: no bubble reported
    why: str = ""

    @property
    def ratio(self) -> float | None:
        """Predicted samples/s over measured: 1.0 is a planner that got it right."""
        return self.row.samples_per_s / self.samples_per_s if self.row else None


def predicted_vs_measured(table, baseline: Run, runs: list[Run]) -> list[Check]:
    """Each run against the row of ``table`` (engine PlanTable, fitted from ``baseline``)
    for its placement and async policy type, measured over the steps the planner would
    fit it from: the latest timed ones, the first left out as warm-up. Samples per step
    are the config's prompts_per_step x group_size, as the fit counts them."""
    base = baseline.run_config
    return [_check(table, base, run) for run in runs]


def _check(table, base, run: Run) -> Check:
    try:
        cfg = run.run_config
    except ConfigError as exc:
        return Check(run, why=f"its stored config no longer validates: {exc}")
    except NotNative as exc:
        return Check(run, why=str(exc))
    for section, key in WORKLOAD:
        theirs, ours = getattr(getattr(cfg, section), key), getattr(getattr(base, section), key)
        if theirs != ours:
            return Check(run, why=f"{section}.{key} is {theirs}, the baseline's {ours}: the "
                                  "prediction is for the baseline's workload")
    row, why = table.row_for(cfg)
    if row is None:
        return Check(run, why=f"the baseline's table has {why}")
    steps = timed_steps(run)
    steps = steps[1:] if len(steps) > 1 else steps
    if not steps:
        return Check(run, why="it has no timed step yet")
    series: dict[str, dict[int, float]] = {M.TIME_STEP_S: {}, M.BUBBLE: {}}
    for name, step, value in (MetricPoint.objects.filter(
            run=run, name__in=list(series), step__in=steps).values_list("name", "step",
                                                                        "value")):
        if value is not None:
            series[name][step] = value
    samples = cfg.rollout.prompts_per_step * cfg.algorithm.group_size
    rates = [samples / s for s in series[M.TIME_STEP_S].values() if s > 0]
    if not rates:
        return Check(run, why="no timed step took any time")
    bubbles = list(series[M.BUBBLE].values())
    return Check(run, row, statistics.median(rates),
                 statistics.median(bubbles) if bubbles else None)
