"""The telemetry contract: what the engine says about a run, and the run's summary.

    tel.emit(MetricsEvent(step=3, values={"reward/mean": 0.4}))   # seq + ts assigned
    event.to_dict() -> JSON -> event_from_dict(...)                # across HTTP and files

Events are typed dataclasses with a per-run sequence number and a dotted ``type``
(``run.status``, ``metrics.append``, ``span``, ``weight_sync.report``, ``checkpoint.saved``,
``control.applied``, ``worker.replaced``, ``workers.resized``, ``samples``, ``log``).
Sinks (engine.telemetry.sinks, http_sink) implement EventSink. Standard library only: the
web process reads these through engine.api.
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
    """One step's metrics under their canonical names (engine/metrics.py), plus eval/* at eval
    steps."""
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
class WorkerReplacedEvent(Event):
    """A rollout worker that died (or stopped answering) was replaced during ``step``: the
    new one on its bundle serves the learner's weights, by both ends' fingerprints, before
    it generates. ``replacements``: how many this run has made, this one included."""
    type: ClassVar[str] = "worker.replaced"
    step: int = 0
    worker: int = 0               # its place among the run's rollout workers
    cause: str = ""
    version: int = 0
    fingerprint_learner: str = ""
    fingerprint_worker: str = ""
    matched: bool = True
    replacements: int = 1

    def __post_init__(self) -> None:
        self.cause = storable_text(self.cause)       # ingest's bound on a text field


@dataclass
class WorkersResizedEvent(Event):
    """The run's rollout workers went from ``previous`` to ``workers`` at the boundary
    before ``step`` (a set_rollout_workers control). Each added worker served the
    learner's weights of ``version`` before it generated: ``fingerprints`` are theirs, one
    per added worker, each checked against ``fingerprint_learner``. A removed worker
    finished its work in flight first; ``devices`` are the devices the rollout workers
    hold now (a removed launch worker's bundle stays reserved in the run's placement
    group, idle, for a later resize to reuse)."""
    type: ClassVar[str] = "workers.resized"
    step: int = 0
    previous: int = 0
    workers: int = 0
    version: int = 0
    fingerprint_learner: str = ""
    fingerprints: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)


SAMPLES_PER_EVENT = 32      # rollouts one samples event carries at most
SAMPLE_TEXT_LIMIT = 4096    # characters of a prompt or completion kept (the head)
SAMPLE_TOKEN_LIMIT = 1024   # per-token entries kept (rollout.max_new_tokens' bound)
TOKEN_TEXT_LIMIT = 32       # characters of one token's text


def storable_text(text: str, limit: int = SAMPLE_TEXT_LIMIT) -> str:
    """Model text as the control plane takes it: the first ``limit`` characters (a
    completion is read from its start), no NUL."""
    if len(text) > limit:
        note = f" [{len(text) - limit} characters cut]"
        text = text[:limit - len(note)] + note
    return text.replace("\x00", "\\0")


@dataclass
class TrajectoryTurn:
    """One turn of a multi-turn trajectory over its rollout's tokens [start, end): the
    model's (its policy version and the reward of the environment step after it, None
    where there was none) or the environment's observation (neither)."""
    role: str = "model"                 # "model" | "env"
    start: int = 0
    end: int = 0
    version: int | None = None
    reward: float | None = None


TURN_ROLES = ("model", "env")


@dataclass
class RolloutSample:
    """One rollout as the inspector shows it. The per-token lists are parallel: the
    response tokens' text, the rollout engine's (behaviour) logprob of each and the
    learner's recomputed logprob before its update (None where not finite)."""
    group: int = 0                # its prompt group within the step
    prompt: str = ""
    completion: str = ""
    reward: float = 0.0
    reason: str = ""              # the reward judge's word ("correct", "timeout", ...)
    advantage: float = 0.0
    version: int = 0              # the (oldest) policy version that generated it
    last_version: int = 0         # the newest, when a partial rollout mixed versions
    staleness: int = 0            # learner version at the update - version
    length: int = 0               # response tokens
    truncated: bool = False       # no EOS within the budget
    tokens: list[str] = field(default_factory=list)
    behaviour_logprobs: list[float | None] = field(default_factory=list)
    learner_logprobs: list[float | None] = field(default_factory=list)
    # A multi-turn trajectory's turns over ``tokens``, in order; empty for a single-turn
    # rollout. An observation's tokens carry no logprob (None): they were not sampled.
    turns: list[TrajectoryTurn] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.prompt, self.completion = storable_text(self.prompt), storable_text(self.completion)
        self.reason = storable_text(self.reason)
        n = min(SAMPLE_TOKEN_LIMIT, len(self.tokens))
        self.tokens = [storable_text(t, TOKEN_TEXT_LIMIT) for t in self.tokens[:n]]
        self.behaviour_logprobs = self.behaviour_logprobs[:n]
        self.learner_logprobs = self.learner_logprobs[:n]
        turns = [t if isinstance(t, TrajectoryTurn) else TrajectoryTurn(**t) for t in self.turns]
        self.turns = [dataclasses.replace(t, end=min(t.end, n)) for t in turns if t.start < n]


@dataclass
class SamplesEvent(Event):
    """A sample of one step's rollouts, whole groups (the telemetry.sample_groups first
    groups of the batch the learner trained on), for the control plane's inspector."""
    type: ClassVar[str] = "samples"
    step: int = 0
    samples: list[RolloutSample] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.samples = [s if isinstance(s, RolloutSample) else RolloutSample(**s)
                        for s in self.samples[:SAMPLES_PER_EVENT]]


@dataclass
class LogEvent(Event):
    type: ClassVar[str] = "log"
    level: str = "info"
    message: str = ""

    def __post_init__(self) -> None:
        self.message = storable_message(self.message)


EVENT_TYPES: dict[str, type[Event]] = {
    c.type: c for c in (RunStatusEvent, MetricsEvent, SpanEvent, WeightSyncEvent,
                        CheckpointEvent, ControlAppliedEvent, WorkerReplacedEvent,
                        WorkersResizedEvent, SamplesEvent, LogEvent)
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
