"""Parse an ingest body into engine events, one verdict per event.

    {"events": [event.to_dict(), ...]}  ->  EventBatch(events=[Event...], errors=[...])

A body that is not that shape raises MalformedBatch (the whole request is refused). An
event that does not validate becomes an error entry {index, seq, error} and the rest of
the batch is still stored: nothing valid is lost because a neighbour was bad.

Each event must carry exactly its dataclass's fields (no unknown, none missing) with the
declared JSON types, so that a row derived from it can always be written: pydantic checks
them, strictly (no "3" for 3), against a model made once per event class from the
dataclass's own type hints. On top of that, what JSON and the tables need: integers a
browser keeps exact, finite numbers outside metric values, seq >= 1, a known run status,
named metrics. Metric values may be NaN or +-inf (a diverging loss is worth seeing); they
are stored as null.

A seq may run at most MAX_SEQ_AHEAD past the highest seq the run has stored. The engine
counts seqs up by one per event; its gaps are only the events it set aside or lost in
memory when it crashed, a few batches at most. Without the bound one event at 2**53 - 1
would end the run's live stream for good: pages stream in seq order, and nothing can
follow it.

A run token is as good as a password for one run, so it is treated as hostile: every
value is bounded before anything is stored or drawn. Times (ts, a span's start and end)
are unix seconds between 1970 and 2200; text carries no NUL (PostgreSQL refuses it) and
has a length limit (a message MAX_LOG_CHARS, any other string MAX_TEXT_CHARS); an event
carries at most MAX_METRICS_PER_EVENT metric names of at most MAX_TEXT_CHARS, a samples
event at most SAMPLES_PER_EVENT rollouts of at most SAMPLE_TOKEN_LIMIT tokens each. A body that
is not JSON a server should parse (integers past Python's digit limit, nesting past the
recursion limit) is refused whole, as malformed.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from engine.api import (
    EVENT_TYPES,
    LOG_MESSAGE_LIMIT,
    RUN_STATUSES,
    SAMPLE_TOKEN_LIMIT,
    SAMPLES_PER_EVENT,
    TOKEN_TEXT_LIMIT,
    TURN_ROLES,
    Event,
    MetricsEvent,
    RunStatusEvent,
)
from jobs import fastjson

MAX_EVENTS_PER_BATCH = 5000
MAX_SAFE_INT = 2**53 - 1  # what a browser's JSON.parse keeps exact
MAX_UNIX_S = 7_258_118_400.0  # 2200-01-01: later "times" overflow datetimes and charts
MAX_LOG_CHARS = LOG_MESSAGE_LIMIT  # the engine cuts its own log lines to this
MAX_TEXT_CHARS = 4096
MAX_METRICS_PER_EVENT = 2000
MAX_SEQ_AHEAD = 10 * MAX_EVENTS_PER_BATCH  # past the run's highest stored seq (docstring)
TIME_FIELDS = ("ts", "start", "end")


class MalformedBatch(ValueError):
    status = 400


class BatchTooLarge(MalformedBatch):
    status = 413


@dataclass
class EventBatch:
    events: list[Event]
    errors: list[dict[str, Any]]


def parse_event_batch(body: bytes, stored_seq: int = 0) -> EventBatch:
    """``stored_seq``: the highest seq the run has stored (0 for none)."""
    try:
        data = fastjson.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedBatch(f"the body is not JSON ({exc})") from None
    except RecursionError:
        raise MalformedBatch("the body nests JSON too deeply; events are flat objects") from None
    except ValueError as exc:      # e.g. an integer past Python's 4300-digit limit
        raise MalformedBatch(f"the body has a value no event can hold ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("events"), list):
        raise MalformedBatch('the body must be a JSON object {"events": [event, ...]}')
    items = data["events"]
    if len(items) > MAX_EVENTS_PER_BATCH:
        raise BatchTooLarge(
            f"{len(items)} events in one batch; send at most {MAX_EVENTS_PER_BATCH}"
        )
    batch = EventBatch(events=[], errors=[])
    for index, item in enumerate(items):
        seq = item.get("seq") if isinstance(item, dict) else None
        try:
            batch.events.append(parse_event(item, stored_seq))
        except ValueError as exc:
            batch.errors.append({"index": index, "seq": seq, "error": str(exc)})
    return batch


def parse_event(item: Any, stored_seq: int = 0) -> Event:
    if not isinstance(item, dict):
        raise ValueError("an event must be a JSON object")
    kind = item.get("type")
    if kind not in EVENT_TYPES:
        known = ", ".join(sorted(EVENT_TYPES))
        raise ValueError(f"unknown event type {kind!r} (known: {known})")
    cls = EVENT_TYPES[kind]
    try:
        fields = schema_of(cls).model_validate({k: v for k, v in item.items()
                                                if k != "type"}).model_dump()
    except ValidationError as exc:
        raise ValueError(f"{kind}{describe(exc.errors())}") from None
    for name, value in fields.items():
        if problem := out_of_range(value) or out_of_bounds(cls, name, value):
            raise ValueError(f"{kind}.{name}: {problem}")
    event = cls(**fields)
    if event.seq < 1:
        raise ValueError(f"{kind}.seq: must be >= 1 (got {event.seq})")
    if event.seq > stored_seq + MAX_SEQ_AHEAD:
        raise ValueError(
            f"{kind}.seq: {event.seq} is more than {MAX_SEQ_AHEAD} past the run's highest "
            f"stored seq ({stored_seq}); number events one by one from 1")
    if isinstance(event, RunStatusEvent) and event.status not in RUN_STATUSES:
        raise ValueError(f"{kind}.status: {event.status!r} is not one of {RUN_STATUSES}")
    if isinstance(event, MetricsEvent) and "" in event.values:
        raise ValueError(f"{kind}.values: a metric needs a name, got ''")
    return event


@functools.cache
def schema_of(cls: type) -> type[BaseModel]:
    """A strict pydantic model of an event dataclass: its fields, each required; a list of
    dataclasses (a samples event's rollouts) is a list of their own strict models."""
    hints = typing.get_type_hints(cls)

    def strict(hint):
        args = typing.get_args(hint)
        if typing.get_origin(hint) is list and dataclasses.is_dataclass(args[0]):
            return list[schema_of(args[0])]
        return hint

    return create_model(cls.__name__, __config__=ConfigDict(extra="forbid", strict=True),
                        **{f.name: (strict(hints[f.name]), [] if f.name in LATER_FIELDS else ...)
                           for f in dataclasses.fields(cls)})


# Fields added after clients were released: optional, so an older client's events still
# validate (a rollout without turns is a single-turn one).
LATER_FIELDS = frozenset({"turns"})


EXPECTED = {"int_type": "an integer", "float_type": "a number", "string_type": "a string",
            "bool_type": "true or false", "dict_type": "an object"}


def describe(errors: list[dict[str, Any]]) -> str:
    """pydantic's errors as one message after the event type: all unknown fields, else
    all missing ones, else the first field whose value is wrong and what it should be."""
    for kind, what in (("extra_forbidden", "unknown"), ("missing", "missing")):
        if names := sorted(path(e["loc"]) for e in errors if e["type"] == kind):
            return f": {what} field(s) {', '.join(names)}"
    err = errors[0]
    loc = err["loc"]
    if len(loc) > 2 and isinstance(loc[-1], str):     # a nested object's field: name it whole
        field, where = path(loc), ""
    else:
        field, where = path(loc[:-1] or loc), f" at {loc[-1]!r}" if len(loc) > 1 else ""
    expected = EXPECTED.get(err["type"], err["msg"].removeprefix("Input should be ").lower())
    try:
        got = repr(err["input"])
    except RecursionError:   # orjson decodes nesting to 1,024 levels, deeper than repr goes
        got = "a value nested too deeply"
    return f".{field}: expected {expected}{where}, got {got}"


def path(loc: tuple) -> str:
    """('samples', 0, 'reward') -> 'samples[0].reward'."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")


def out_of_range(value: Any) -> str | None:
    """What JSON and the tables need beyond the type: integers a browser's JSON.parse
    keeps exact, and finite numbers (a metric value, inside a dict, may be NaN)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and abs(value) > MAX_SAFE_INT:
        return f"{value} is out of range (|n| <= 2**53 - 1)"
    if isinstance(value, float) and not math.isfinite(value):
        return f"expected a finite number, got {value!r}"
    return None


def out_of_bounds(cls: type[Event], name: str, value: Any) -> str | None:
    """The limits a hostile token could otherwise push past (module docstring)."""
    if name in TIME_FIELDS and isinstance(value, float | int) and not (
            0 <= value <= MAX_UNIX_S):
        return f"{value!r} is not a time (unix seconds between 1970 and 2200)"
    if isinstance(value, str):
        limit = MAX_LOG_CHARS if name == "message" else MAX_TEXT_CHARS
        return text_problem(value, limit)
    if isinstance(value, dict):
        if len(value) > MAX_METRICS_PER_EVENT:
            return (f"{len(value)} metrics in one event; send at most "
                    f"{MAX_METRICS_PER_EVENT}")
        # all names at once first (64 a step, 12,800 a batch); each, to say which is wrong
        if "\x00" in "".join(value) or max(map(len, value), default=0) > MAX_TEXT_CHARS:
            for key in value:
                if problem := text_problem(key, MAX_TEXT_CHARS):
                    return f"a name {problem}"
    if isinstance(value, list):
        return samples_problem(value)
    return None


TOKEN_LISTS = ("tokens", "behaviour_logprobs", "learner_logprobs")


def samples_problem(samples: list[dict[str, Any]]) -> str | None:
    """A samples event's rollouts (engine.events.RolloutSample as dicts): how many, and
    each value's bound; the per-token lists parallel, of bounded length."""
    if len(samples) > SAMPLES_PER_EVENT:
        return f"{len(samples)} rollouts in one event; send at most {SAMPLES_PER_EVENT}"
    for i, sample in enumerate(samples):
        for name, value in sample.items():
            if isinstance(value, list):
                problem = (f"has {len(value)} entries; the limit is {SAMPLE_TOKEN_LIMIT}"
                           if len(value) > SAMPLE_TOKEN_LIMIT else None)
                for item in value:
                    problem = problem or (text_problem(item, TOKEN_TEXT_LIMIT)
                                          if isinstance(item, str) else out_of_range(item))
            elif isinstance(value, str):
                problem = text_problem(value, MAX_TEXT_CHARS)
            else:
                problem = out_of_range(value)
            if problem:
                return f"[{i}].{name} {problem}"
        if len({len(sample[name]) for name in TOKEN_LISTS}) > 1:
            return (f"[{i}]: tokens, behaviour_logprobs and learner_logprobs must have one "
                    f"entry per token (got {', '.join(str(len(sample[n])) for n in TOKEN_LISTS)})")
        if problem := turns_problem(sample.get("turns", []), len(sample["tokens"])):
            return f"[{i}].turns{problem}"
    return None


def turns_problem(turns: list[dict[str, Any]], tokens: int) -> str | None:
    """A trajectory's turns (engine.events.TrajectoryTurn) must tile a prefix of its
    tokens in order, each a known role and at least one token long."""
    at = 0
    for k, turn in enumerate(turns):
        if turn["role"] not in TURN_ROLES:
            return f"[{k}].role: {turn['role']!r} is not one of {', '.join(TURN_ROLES)}"
        if not at <= turn["start"] < turn["end"] <= tokens:
            return (f"[{k}]: [{turn['start']}, {turn['end']}) must start where the turn "
                    f"before ended ({at}) and end past its start, within the {tokens} tokens")
        if turn["start"] != at:
            return (f"[{k}].start: {turn['start']} leaves a gap after the turn before "
                    f"(which ended at {at}); turns follow one another")
        at = turn["end"]
    return None


def text_problem(text: str, limit: int) -> str | None:
    if "\x00" in text:
        return "contains a NUL character"
    if len(text) > limit:
        return f"is {len(text)} characters long; the limit is {limit}"
    return None


def json_safe(value: Any) -> Any:
    """``value`` with NaN and +-inf replaced by None, so it can be stored and sent as JSON.
    A finite float in a container is kept without a call (a metrics event's values: 64
    a step, 12,800 a batch)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: v if type(v) is float and math.isfinite(v) else json_safe(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [v if type(v) is float and math.isfinite(v) else json_safe(v) for v in value]
    return value
