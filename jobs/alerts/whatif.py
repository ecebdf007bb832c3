"""The planner's what-if from a run's series and spans (no database here: the rules and the
pages both call it).

    table, why = plan_history(cfg, metrics, spans)    # engine.api.plan_run, or (None, why)
    planner_advice(cfg, h.metrics, h.spans)           # BubbleHigh's runbook sentence
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from engine.api import PlanError, plan_run
from engine.config import RunConfig

MIN_GAIN = 1.05       # a predicted gain below this is noise, not advice


def plan_history(cfg: RunConfig, metrics: Mapping[str, Mapping[int, float]], spans: Iterable,
                 devices: int | None = None):
    """(engine PlanTable, "") or (None, why the planner cannot fit the run)."""
    try:
        return plan_run(cfg, metrics, spans, devices), ""
    except PlanError as exc:
        return None, str(exc)


def planner_advice(cfg: RunConfig, metrics: Mapping[str, Mapping[int, float]],
                   spans: Iterable) -> str:
    """A runbook sentence naming the best alternative's predicted gain, or "" when the
    planner cannot fit the run or predicts nothing clearly better."""
    table, _ = plan_history(cfg, metrics, spans)
    if table is None or table.best is table.current or table.gain < MIN_GAIN:
        return ""
    return f"What-if: {table.summary()}."
