"""The telemetry contract: what the engine says about a run, and the run's summary.

    tel.emit(MetricsEvent(step=3, values={"reward/mean": 0.4}))   # seq + ts assigned
    event.to_dict() -> JSON -> event_from_dict(...)                # across HTTP and files

Events are typed dataclasses with a per-run sequence number and a dotted ``type``
(``run.status``, ``metrics.append``, ``span``, ``weight_sync.report``, ``checkpoint.saved``,
``control.applied``, ``log``). Sinks (engine.telemetry.sinks, http_sink) implement
EventSink. Standard library only: the web process reads these through engine.api.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

RUN_STATUSES = ("starting", "warm_start", "running", "succeeded", "failed", "stopped")


@dataclass
class Event:
    type: ClassVar[str] = "event"
    seq: int = 0           # per-run, strictly increasing; assigned by the telemetry emitter
    ts: float = 0.0        # unix seconds when emitted

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, **dataclasses.asdict(self)}


LOG_MESSAGE_LIMIT = 65536
"""Characters of a message (a log line, a status's reason) the control plane stores."""


def storable_message(message: str) -> str:
    """``message`` as the control plane will take it: at most LOG_MESSAGE_LIMIT characters
    (the tail kept: the end of a traceback is the part worth reading), no NUL."""
    if len(message) > LOG_MESSAGE_LIMIT:
        cut = len(message) - LOG_MESSAGE_LIMIT + 40
        message = f"[{cut} characters cut] " + message[cut:]
    return message.replace("\x00", "\\0")


@dataclass
class RunStatusEvent(Event):
    type: ClassVar[str] = "run.status"
    status: str = "starting"
    message: str = ""

    def __post_init__(self) -> None:
        self.message = storable_message(self.message)


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
    verified: bool = True         # False: weight_sync.verify_every skipped the fingerprints
    wire_bytes: int = 0           # what each worker received (weight_sync.delta: less)


@dataclass
class CheckpointEvent(Event):
    """A checkpoint the loop finished writing (a fork or resume can start from it)."""
    type: ClassVar[str] = "checkpoint.saved"
    step: int = 0
    version: int = 0
    path: str = ""
    fingerprint: str = ""


@dataclass
class ControlAppliedEvent(Event):
    """A live control (engine.controls) the loop applied at a step boundary: it takes
    effect from ``step`` (the next step to run). ``control_id`` is the control plane's id
    of the request, so it can mark that request applied."""
    type: ClassVar[str] = "control.applied"
    control_id: int = 0
    kind: str = ""
    value: float | None = None
    step: int = 0
    requested_by: str = ""
    message: str = ""


@dataclass
class LogEvent(Event):
    type: ClassVar[str] = "log"
    level: str = "info"
    message: str = ""

    def __post_init__(self) -> None:
        self.message = storable_message(self.message)


EVENT_TYPES: dict[str, type[Event]] = {
    c.type: c for c in (RunStatusEvent, MetricsEvent, SpanEvent, WeightSyncEvent,
                        CheckpointEvent, ControlAppliedEvent, LogEvent)
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
