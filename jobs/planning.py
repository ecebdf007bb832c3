"""What the planner predicts for a run, fitted from what the control plane stored.

    table, why = plan_for_run(run)      # engine.api.plan_run over its MetricPoint and
                                        # PhaseSpan rows; (None, reason) when it cannot fit
    {% include "jobs/_plan_table.html" with plan=table plan_error=why %}

The fork page shows the parent's table; the compare page can include the same template.
BubbleHigh's runbook asks jobs.alerts.whatif, which reads no database, from the history.
"""

from __future__ import annotations

from engine.config import ConfigError, validate_config
from jobs.alerts.whatif import plan_history
from jobs.models import MetricPoint, PhaseSpan, Run

PLAN_STEPS = 51          # the latest steps fitted (the planner leaves the first one out)


def plan_for_run(run: Run, devices: int | None = None):
    """(engine PlanTable, "") or (None, why it cannot be planned)."""
    try:
        cfg = validate_config(run.config, check_files=False)
    except ConfigError as exc:
        return None, f"its stored config no longer validates: {exc}"
    timed = (MetricPoint.objects.filter(run=run, name="time/step_s")
             .order_by("-step").values_list("step", flat=True)[:PLAN_STEPS])
    steps = list(timed)
    if not steps:
        return None, "it has no timed step yet"
    first = min(steps)
    metrics: dict[str, dict[int, float]] = {}
    for name, step, value in (MetricPoint.objects.filter(run=run, step__gte=first)
                              .values_list("name", "step", "value")):
        if value is not None:
            metrics.setdefault(name, {})[step] = value
    spans = PhaseSpan.objects.filter(run=run, step__gte=first).only(
        "device", "phase", "start", "end", "step")
    return plan_history(cfg, metrics, spans, devices)
