import json
import math
import sys

import pytest

from engine.api import MetricsEvent, RunStatusEvent
from jobs.ingest.batch import BatchTooLarge, MalformedBatch, json_safe, parse_event_batch

from .helpers import log, metrics, span


def body(*events) -> str:
    return json.dumps({"events": [e.to_dict() if hasattr(e, "to_dict") else e for e in events]})


def test_a_batch_of_engine_events_round_trips_into_the_same_events():
    events = [metrics(1, 0, **{"reward/mean": 0.5}), span(2, 0), log(3)]

    batch = parse_event_batch(body(*events).encode())

    assert batch.events == events and batch.errors == []


@pytest.mark.parametrize(("raw", "message"), [
    (b"not json", "not JSON"),
    (b"\xff\xfe", "not JSON"),
    (b"[]", '{"events": [event, ...]}'),
    (b'{"events": {}}', '{"events": [event, ...]}'),
    (b'{"evnts": []}', '{"events": [event, ...]}'),
])
def test_a_body_that_is_not_an_events_list_is_malformed_with_a_message(raw, message):
    with pytest.raises(MalformedBatch, match=message.replace("[", r"\[").replace("{", r"\{")):
        parse_event_batch(raw)


def test_too_many_events_in_one_batch_is_too_large():
    with pytest.raises(BatchTooLarge, match="send at most"):
        parse_event_batch(body(*[log(i + 1) for i in range(5001)]).encode())


GOOD = log(1).to_dict()


@pytest.mark.parametrize(("event", "error"), [
    ("a string", "must be a JSON object"),
    ({**GOOD, "type": "log.v2"}, "unknown event type 'log.v2'"),
    ({k: v for k, v in GOOD.items() if k != "type"}, "unknown event type None"),
    ({**GOOD, "colour": "red"}, "log: unknown field(s) colour"),
    ({k: v for k, v in GOOD.items() if k != "message"}, "log: missing field(s) message"),
    ({**GOOD, "seq": 0}, "log.seq: must be >= 1"),
    ({**GOOD, "seq": "3"}, "log.seq: expected an integer"),
    ({**GOOD, "seq": True}, "log.seq: expected an integer"),
    ({**GOOD, "seq": 2**60}, "is out of range (|n| <= 2**53 - 1)"),
    ({**GOOD, "ts": "now"}, "log.ts: expected a number, got 'now'"),
    ({**GOOD, "ts": math.nan}, "log.ts: expected a finite number"),
    ({**GOOD, "message": 5}, "log.message: expected a string"),
    ({**metrics(1, 0).to_dict(), "values": [1]}, "metrics.append.values: expected an object"),
    ({**metrics(1, 0).to_dict(), "values": {"x": "1"}}, "metrics.append.values: expected"),
    ({**metrics(1, 0).to_dict(), "values": {"": 1.0}}, "metrics.append.values: a metric needs"),
    ({**GOOD, "colour": "red", "size": 2}, "log: unknown field(s) colour, size"),
    ({**GOOD, "level": True}, "log.level: expected a string"),
    ({**span(1, 0).to_dict(), "end": math.inf}, "span.end: expected a finite number"),
    ({**metrics(1, 0).to_dict(), "step": 1.5}, "metrics.append.step: expected an integer"),
    ({**RunStatusEvent(seq=1).to_dict(), "status": "paused"}, "'paused' is not one of"),
])
def test_an_invalid_event_is_reported_with_its_index_seq_and_what_is_wrong(event, error):
    batch = parse_event_batch(body(GOOD, event).encode())

    assert batch.events == [log(1)]
    [problem] = batch.errors
    assert problem["index"] == 1
    assert problem["seq"] == (event.get("seq") if isinstance(event, dict) else None)
    assert error in problem["error"]


def test_a_whole_number_where_a_float_is_declared_is_accepted_as_a_float():
    [event] = parse_event_batch(body({**GOOD, "ts": 1001}).encode()).events

    assert event.ts == 1001.0 and isinstance(event.ts, float)


def test_non_finite_metric_values_are_accepted_and_made_json_safe():
    raw = '{"events": [{"type": "metrics.append", "seq": 1, "ts": 1.0, "step": 0,' \
          ' "values": {"loss": NaN, "grad": Infinity, "ok": 2}}]}'

    [event] = parse_event_batch(raw.encode()).events

    assert isinstance(event, MetricsEvent) and math.isnan(event.values["loss"])
    assert json_safe(event.to_dict())["values"] == {"loss": None, "grad": None, "ok": 2}


def test_a_field_nested_deeper_than_repr_goes_is_a_bad_event_not_a_crash():
    """orjson decodes 1,000 levels, past what repr reaches under the process's recursion
    limit (1,000 by default; a pytest-xdist worker's is higher, so it is set here): the
    error message must not repr them."""
    deep = "[" * 1000 + "]" * 1000
    body = ('{"events": [{"type": "log", "seq": 1, "ts": 1.0, "level": "info", '
            f'"message": {deep}}}]}}').encode()
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(900)
    try:
        batch = parse_event_batch(body)
    finally:
        sys.setrecursionlimit(limit)

    assert not batch.events and "message" in batch.errors[0]["error"]
    assert "nested too deeply" in batch.errors[0]["error"]
