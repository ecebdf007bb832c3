"""The engine's public surface: the only module (with engine.config) that jobs/ imports.

    cfg = validate(form_data)                     # RunConfig or ConfigError(field, fix)
    summary = run_local(cfg, out_dir, sink=sink)  # the RL loop, in this process
    table = plan_run(cfg, metrics, spans)         # what-if: placement x policy (planner)
    for line in events.jsonl: event_from_dict(json.loads(line))
    mark_run_dir(run_dir, key)                    # before a driver starts (engine.run_dir)

The event types live in engine.events and the metric names in engine.metrics; they are
re-exported here for the control plane (``from engine.api import metrics as M``), and
engine.frameworks' name mapping for external runs (``canonical_metrics``, ``their_names``).
No torch or ray import happens at import time (the web process imports this module), so
``run_local`` imports the loop when it is called.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from engine import metrics
from engine.config import ConfigError, RunConfig, load_config, validate_config
from engine.controls import (
    CONTROL_KINDS,
    CONTROL_VALUE_TYPES,
    Control,
    ControlError,
    check_control,
    control_label,
    validate_control,
)
from engine.events import (
    EVENT_TYPES,
    LOG_MESSAGE_LIMIT,
    RUN_STATUSES,
    SAMPLE_TOKEN_LIMIT,
    SAMPLES_PER_EVENT,
    TOKEN_TEXT_LIMIT,
    TURN_ROLES,
    CheckpointEvent,
    ControlAppliedEvent,
    Event,
    EventSink,
    LogEvent,
    MetricsEvent,
    RolloutSample,
    RunStatusEvent,
    RunSummary,
    SamplesEvent,
    SpanEvent,
    WeightSyncEvent,
    WorkerReplacedEvent,
    WorkersResizedEvent,
    event_from_dict,
)
from engine.frameworks import (
    FRAMEWORK_LABELS,
    FRAMEWORKS,
    canonical_metrics,
    their_names,
)
from engine.metrics import TIME_LEARNER_S, TIME_STEP_S
from engine.run_dir import mark_run_dir

__all__ = [
    "CONTROL_KINDS", "CONTROL_VALUE_TYPES", "EVENT_TYPES", "LOG_MESSAGE_LIMIT", "RUN_STATUSES",
    "FRAMEWORKS", "FRAMEWORK_LABELS", "SAMPLES_PER_EVENT",
    "SAMPLE_TOKEN_LIMIT", "TOKEN_TEXT_LIMIT", "TURN_ROLES", "CheckpointEvent",
    "ConfigError", "Control", "ControlAppliedEvent", "ControlError",
    "Event", "EventSink", "LogEvent", "MetricsEvent", "RunConfig", "RunStatusEvent",
    "PlanError", "RolloutSample", "RunSummary", "SamplesEvent", "SpanEvent",
    "WeightSyncEvent", "WorkerReplacedEvent", "WorkersResizedEvent", "check_control",
    "event_from_dict", "load_config",
    "placement_bundles",
    "canonical_metrics", "control_label", "launch_rollout_workers", "mark_run_dir", "metrics",
    "placement_demand", "plan_run",
    "run_local", "their_names", "validate", "validate_control",
]


def validate(data: dict[str, Any]) -> RunConfig:
    """A RunConfig from plain data, or ConfigError naming each bad field and its fix."""
    return validate_config(data)


def run_local(cfg: RunConfig, out_dir: str | Path, *, steps: int | None = None,
              sink: EventSink | None = None, resume: bool = False,
              progress=None, stop_requested: Callable[[], bool] | None = None,
              take_controls: Callable[[], list[Control]] | None = None) -> RunSummary:
    """Run the RL loop in this process (the CLI and Ray jobs both end here).
    ``stop_requested`` is asked after each step; True checkpoints and stops the run.
    ``take_controls`` is asked at each step boundary for live controls to apply."""
    from engine.orchestration.loop import RunLoop  # torch: not at the web's import time

    return RunLoop(cfg, Path(out_dir), sink=sink, progress=progress,
                   stop_requested=stop_requested,
                   take_controls=take_controls).run(steps=steps, resume=resume)


class PlanError(ValueError):
    """The run cannot be planned from what it reported (no timed step yet, or a metric
    the fit needs is missing); the message says which."""


def plan_run(cfg: RunConfig, metrics: Mapping[str, Mapping[int, float]], spans: Iterable = (),
             devices: int | None = None):
    """The planner's what-if table for a run (engine.planner.PlanTable): fitted from its
    metrics ({name: {step: value}}) and phase spans (objects with device, phase, start,
    end, step), each placement x async policy on ``devices`` (default: the run's).
    Raises PlanError when it cannot fit."""
    from engine.planner import FitError, fit_run, plan_table  # numpy: only when asked
    from engine.planner.fit import MAX_FIT_STEPS

    # The timed steps fit_run reads: it drops the first (warm-up) and keeps the last
    # MAX_FIT_STEPS, so one more than those is the same fit as all of them. Each step's
    # values gathered across every series cost the alert rules ~10 ms an evaluation on
    # a run of a thousand steps (BubbleHigh's what-if) when it was every step.
    learner = metrics.get(TIME_LEARNER_S, {})
    steps = [s for s in sorted(metrics.get(TIME_STEP_S, {})) if s in learner]
    steps = steps[-(MAX_FIT_STEPS + 1):]
    rows = [{name: series[s] for name, series in metrics.items() if s in series}
            for s in steps]
    try:
        fit = fit_run(cfg, rows, list(spans), steps)
    except (FitError, ValueError) as exc:     # ValueError: a length or cost out of range
        raise PlanError(str(exc)) from exc
    except KeyError as exc:
        raise PlanError(f"the run did not report {exc.args[0]}, which the planner fits "
                        f"from (a run from an older engine?)") from exc
    return plan_table(fit, cfg, devices)


def placement_bundles(cfg: RunConfig,
                      rollout_workers: int | None = None) -> list[dict[str, float]]:
    """The Ray bundles the run holds ([{"GPU": 1.0}, ...]), or [] for the in-process
    default: its launch placement's, or with ``rollout_workers`` (a live resize's count)
    one more per worker beyond the launch's (engine.orchestration.placement)."""
    from engine.orchestration.placement import grown_bundles, layout_for  # kept light

    layout = layout_for(cfg.placement)
    if rollout_workers is None:
        return list(layout.bundles)
    return grown_bundles(layout, rollout_workers)


def launch_rollout_workers(cfg: RunConfig) -> int:
    """How many rollout workers the run's placement starts with."""
    from engine.orchestration.placement import layout_for

    return len(layout_for(cfg.placement).workers)


def placement_demand(cfg: RunConfig, rollout_workers: int | None = None) -> dict[str, float]:
    """What the run's placement reserves on Ray, summed over its bundles ({"GPU": 4.0}),
    or {} for the in-process default, which reserves nothing on Ray; ``rollout_workers``
    as in placement_bundles."""
    demand: dict[str, float] = {}
    for bundle in placement_bundles(cfg, rollout_workers):
        for name, amount in bundle.items():
            demand[name] = demand.get(name, 0.0) + amount
    return demand
