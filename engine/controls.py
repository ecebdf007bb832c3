"""Live controls: what an operator may change on a running run, typed and validated here
once for both ends (the control plane checks a request with ``validate_control``; the
driver parses what it polls with the same models).

    operator -> control plane (RunControl row, id N) -> driver polls "after N-1"
        -> RunLoop applies it at the next step boundary -> ControlAppliedEvent(control_id=N)
        -> ingest marks the row applied (step, time)

    {"kind": "checkpoint"}                      write a checkpoint now
    {"kind": "pause"} / {"kind": "resume"}      hold before the next step / go on
    {"kind": "set_lr", "value": 5e-5}           every param group's lr, from the next step
    {"kind": "set_eval_every", "value": 10}     held-out eval cadence (0 = never mid-run)
    {"kind": "set_rollout_workers", "value": 3} rollout workers from the next step (on Ray,
                                                with a point-to-point weight sync:
                                                ``check_control`` says when not)

Standard library, pydantic and engine.config only: the web process imports this through
engine.api.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from engine.config import RunConfig
from engine.config.placement import MAX_ROLLOUT_WORKERS
from engine.config.weightsync import COLLECTIVE_TRANSPORTS


class _Control(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)

    id: int = Field(default=0, ge=0)
    """The control plane's id of the request (0 for one made in the engine's own process)."""
    requested_by: str = Field(default="", max_length=150)
    """Who asked for it (a username), for the run's log."""


class CheckpointControl(_Control):
    kind: Literal["checkpoint"] = "checkpoint"


class PauseControl(_Control):
    kind: Literal["pause"] = "pause"


class ResumeControl(_Control):
    kind: Literal["resume"] = "resume"


class SetLrControl(_Control):
    kind: Literal["set_lr"] = "set_lr"
    value: float = Field(gt=0.0, le=1.0, allow_inf_nan=False, title="lr")
    """The policy's new AdamW learning rate (every param group), from the next step on."""


class SetEvalEveryControl(_Control):
    kind: Literal["set_eval_every"] = "set_eval_every"
    value: int = Field(ge=0, le=1_000_000, title="eval every")
    """Run the held-out eval every this many steps from now on (0: only before and after)."""


class SetRolloutWorkersControl(_Control):
    kind: Literal["set_rollout_workers"] = "set_rollout_workers"
    value: int = Field(ge=1, le=MAX_ROLLOUT_WORKERS, title="rollout workers")
    """How many rollout workers generate from the next step on. An added one gets a bundle
    of its own, like the others', and the learner's current weights (fingerprinted on both
    ends) before it generates; a removed one finishes its work in flight first."""


Control = Annotated[
    CheckpointControl | PauseControl | ResumeControl | SetLrControl | SetEvalEveryControl
    | SetRolloutWorkersControl,
    Field(discriminator="kind"),
]
_ADAPTER: TypeAdapter[Control] = TypeAdapter(Control)
_MODELS = {m.model_fields["kind"].default: m for m in get_args(get_args(Control)[0])}
CONTROL_KINDS = tuple(_MODELS)
# The kinds that take a value, and its type (the control plane stores every value as a
# float; the driver's poll gets it back as this type). The value field's title names it
# in control_label.
CONTROL_VALUE_TYPES: dict[str, type] = {
    kind: m.model_fields["value"].annotation
    for kind, m in _MODELS.items() if "value" in m.model_fields}


def control_label(kind: str, value: float | None) -> str:
    """How the pages, charts and logs name a live control: 'lr 5e-05', 'eval every 10', 'pause'."""
    if kind in CONTROL_VALUE_TYPES and value is not None:
        typed = CONTROL_VALUE_TYPES[kind](value)
        shown = f"{typed:g}" if isinstance(typed, float) else str(typed)
        return f"{_MODELS[kind].model_fields['value'].title} {shown}"
    return kind


class ControlError(ValueError):
    """A control that does not validate: one (field, message) per problem, each naming the
    field and what it should be."""

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = errors
        super().__init__("; ".join(f"{f}: {m}" for f, m in errors))


def validate_control(data: Any) -> Control:
    """A typed control from plain data ({"kind": ..., "value": ...}), or ControlError."""
    if isinstance(data, dict) and data.get("kind") in CONTROL_KINDS \
            and data.get("kind") not in CONTROL_VALUE_TYPES and data.get("value") is None:
        data = {k: v for k, v in data.items() if k != "value"}  # a form's empty value
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as exc:
        raise ControlError([_describe(e) for e in exc.errors()]) from None


def check_control(control: Control, cfg: RunConfig) -> None:
    """ControlError when ``control`` is valid but cannot apply to a run of ``cfg``: the
    control plane asks before it stores one, and the loop refuses one the same way."""
    if not isinstance(control, SetRolloutWorkersControl):
        return
    placement = cfg.placement
    if placement.type == "colocated" and not placement.ray:
        raise ControlError([("kind", (
            "set_rollout_workers resizes rollout workers placed on Ray, and this run keeps "
            "its one rollout worker in the driver's process (placement.ray = false); "
            "launch it with placement.ray = true or a disaggregated placement to resize "
            "it live"))])
    if cfg.weight_sync.type in COLLECTIVE_TRANSPORTS:
        raise ControlError([("kind", (
            f'set_rollout_workers needs a weight sync a worker can join mid-run, and '
            f'weight_sync.type = "{cfg.weight_sync.type}" fixes its process group when the '
            f'run starts; launch with weight_sync.type = "object_store" or "shm" to '
            f"resize it live"))])


def _describe(err: dict[str, Any]) -> tuple[str, str]:
    loc = [str(x) for x in err["loc"] if str(x) not in CONTROL_KINDS]
    field = ".".join(loc) or "kind"
    if err["type"] in ("union_tag_invalid", "union_tag_not_found", "model_attributes_type"):
        got = err.get("input")
        got = got.get("kind") if isinstance(got, dict) else got
        return "kind", f"must be one of {', '.join(CONTROL_KINDS)} (got {got!r})"
    if err["type"] == "extra_forbidden":
        return field, f"{field!r} is not a field of this control; remove it"
    if err["type"] == "missing":
        return field, "required for this kind of control"
    if err["type"] == "finite_number":
        return field, f"must be a finite number (got {err.get('input')!r})"
    return field, f"{err['msg']} (got {err.get('input')!r})"
