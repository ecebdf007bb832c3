"""Parse an ingest body into engine events, one verdict per event.

    {"events": [event.to_dict(), ...]}  ->  EventBatch(events=[Event...], errors=[...])

A body that is not that shape raises MalformedBatch (the whole request is refused). An
event that does not validate becomes an error entry {index, seq, error} and the rest of
the batch is still stored: nothing valid is lost because a neighbour was bad.

Each event must carry exactly its dataclass's fields (no unknown, none missing) with the
declared JSON types, so that a row derived from it can always be written. Metric values may
be NaN or +-inf (a diverging loss is worth seeing); they are stored as null.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

from engine.api import EVENT_TYPES, RUN_STATUSES, Event, RunStatusEvent

MAX_EVENTS_PER_BATCH = 5000
MAX_SAFE_INT = 2**53 - 1  # what a browser's JSON.parse keeps exact


class MalformedBatch(ValueError):
    status = 400


class BatchTooLarge(MalformedBatch):
    status = 413


@dataclass
class EventBatch:
    events: list[Event]
    errors: list[dict[str, Any]]


def parse_event_batch(body: bytes) -> EventBatch:
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedBatch(f"the body is not JSON ({exc})") from None
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
            batch.events.append(parse_event(item))
        except ValueError as exc:
            batch.errors.append({"index": index, "seq": seq, "error": str(exc)})
    return batch


def parse_event(item: Any) -> Event:
    if not isinstance(item, dict):
        raise ValueError("an event must be a JSON object")
    kind = item.get("type")
    if kind not in EVENT_TYPES:
        known = ", ".join(sorted(EVENT_TYPES))
        raise ValueError(f"unknown event type {kind!r} (known: {known})")
    cls = EVENT_TYPES[kind]
    fields = {f.name: f.type for f in dataclasses.fields(cls)}
    given = set(item) - {"type"}
    if unknown := sorted(given - set(fields)):
        raise ValueError(f"{kind}: unknown field(s) {', '.join(unknown)}")
    if missing := sorted(set(fields) - given):
        raise ValueError(f"{kind}: missing field(s) {', '.join(missing)}")
    for name, annotation in fields.items():
        if problem := type_problem(annotation, item[name]):
            raise ValueError(f"{kind}.{name}: {problem}")
    if item["seq"] < 1:
        raise ValueError(f"{kind}.seq: must be >= 1 (got {item['seq']})")
    if cls is RunStatusEvent and item["status"] not in RUN_STATUSES:
        raise ValueError(f"run.status.status: {item['status']!r} is not one of {RUN_STATUSES}")
    return cls(**{name: item[name] for name in fields})


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def type_problem(annotation: str, value: Any) -> str | None:
    """Why ``value`` does not fit the dataclass field annotation, or None if it does.
    (engine.api uses postponed annotations, so these are strings.)"""
    if annotation == "int":
        if not isinstance(value, int) or isinstance(value, bool):
            return f"expected an integer, got {value!r}"
        if abs(value) > MAX_SAFE_INT:
            return f"{value} is out of range (|n| <= 2**53 - 1)"
    elif annotation == "float":
        if not is_number(value) or not math.isfinite(value):
            return f"expected a finite number, got {value!r}"
    elif annotation == "str":
        if not isinstance(value, str):
            return f"expected a string, got {value!r}"
    elif annotation == "bool":
        if not isinstance(value, bool):
            return f"expected true or false, got {value!r}"
    elif annotation == "dict[str, float]":
        if not isinstance(value, dict):
            return f"expected an object of name -> number, got {value!r}"
        for key, number in value.items():
            if not key or not is_number(number):
                return f"expected an object of name -> number, got {key!r}: {number!r}"
    return None


def json_safe(value: Any) -> Any:
    """``value`` with NaN and +-inf replaced by None, so it can be stored and sent as JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value
