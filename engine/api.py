"""The engine's public surface: the only module (with engine.config) that jobs/ imports.

    cfg = validate(form_data)                     # RunConfig or ConfigError(field, fix)
    summary = run_local(cfg, out_dir, sink=sink)  # the driver, in this process
    for line in events.jsonl: event_from_dict(json.loads(line))

Events are typed dataclasses with a per-run sequence number and a dotted ``type``. They
serialize to plain JSON dicts (``to_dict``) so they cross process and HTTP boundaries.
No torch or ray import happens at import time; ``run_local`` imports the driver lazily.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from engine.config import ConfigError, RunConfig, load_config, validate_config

__all__ = [
    "CheckpointEvent", "ConfigError", "Event", "EventSink", "LogEvent", "MetricsEvent", "RunConfig",
    "RunStatusEvent", "RunSummary", "SpanEvent", "WeightSyncEvent", "event_from_dict",
    "load_config", "run_local", "validate",
]

RUN_STATUSES = ("starting", "warm_start", "running", "succeeded", "failed", "stopped")


@dataclass
class Event:
    type: ClassVar[str] = "event"
    seq: int = 0           # per-run, strictly increasing; assigned by the telemetry emitter
    ts: float = 0.0        # unix seconds when emitted

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, **dataclasses.asdict(self)}


@dataclass
class RunStatusEvent(Event):
    type: ClassVar[str] = "run.status"
    status: str = "starting"
    message: str = ""


@dataclass
class MetricsEvent(Event):
    """One step's metrics, canonical names (DESIGN.md §4), plus eval/* at eval steps."""
    type: ClassVar[str] = "metrics.append"
    step: int = 0
    values: dict[str, float] = field(default_factory=dict)


@dataclass
class SpanEvent(Event):
    """A phase (rollout, reward, learner, weight_sync) busy on one logical device."""
    type: ClassVar[str] = "span"
    device: str = ""
    phase: str = ""
    start: float = 0.0
    end: float = 0.0
    step: int = 0
    version: int = 0


@dataclass
class WeightSyncEvent(Event):
    """What both ends of a weight sync say: the learner's fingerprint of what it sent and
    the fingerprint the rollout engine recomputed from what it now serves."""
    type: ClassVar[str] = "weight_sync.report"
    step: int = 0
    transport: str = ""
    version_learner: int = 0
    version_rollout: int = 0
    fingerprint_learner: str = ""
    fingerprint_rollout: str = ""
    matched: bool = True
    latency_s: float = 0.0
    bytes: int = 0


@dataclass
class CheckpointEvent(Event):
    """A checkpoint the driver finished writing (a fork or resume can start from it)."""
    type: ClassVar[str] = "checkpoint.saved"
    step: int = 0
    version: int = 0
    path: str = ""
    fingerprint: str = ""


@dataclass
class LogEvent(Event):
    type: ClassVar[str] = "log"
    level: str = "info"
    message: str = ""


EVENT_TYPES: dict[str, type[Event]] = {
    c.type: c for c in (RunStatusEvent, MetricsEvent, SpanEvent, WeightSyncEvent,
                        CheckpointEvent, LogEvent)
}


def event_from_dict(data: dict[str, Any]) -> Event:
    data = dict(data)
    cls = EVENT_TYPES[data.pop("type")]
    return cls(**data)


class EventSink(Protocol):
    def emit(self, event: Event) -> None: ...

    def close(self) -> None: ...


@dataclass
class RunSummary:
    status: str
    steps_done: int
    eval_before: dict[str, float]
    eval_after: dict[str, float]
    last_metrics: dict[str, float]
    out_dir: str
    wall_s: float


def validate(data: dict[str, Any]) -> RunConfig:
    """A RunConfig from plain data, or ConfigError naming each bad field and its fix."""
    return validate_config(data)


def run_local(cfg: RunConfig, out_dir: str | Path, *, steps: int | None = None,
              sink: EventSink | None = None, resume: bool = False,
              progress=None, stop_requested: Callable[[], bool] | None = None) -> RunSummary:
    """Run the engine driver in this process (the CLI and Ray jobs both end here).
    ``stop_requested`` is asked after each step; True checkpoints and stops the run."""
    from engine.orchestration.driver import RunDriver

    return RunDriver(cfg, Path(out_dir), sink=sink, progress=progress,
                     stop_requested=stop_requested).run(steps=steps, resume=resume)
