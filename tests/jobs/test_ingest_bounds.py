"""A valid run token is treated as hostile (issue 19 items 5-6): each value that used to
give a 500 or an unbounded row is refused with a 400 naming the field, the rest of the
batch is stored, and bodies are bounded before Django spools them."""

import asyncio
import json

import pytest

from controlplane.asgi import application
from engine.api import LOG_MESSAGE_LIMIT, LogEvent, RunStatusEvent
from jobs.ingest.batch import MAX_SEQ_AHEAD
from jobs.models import Checkpoint, PhaseSpan, RunEvent

from .helpers import checkpoint, log, post_body, post_events, span

pytestmark = pytest.mark.django_db


def hostile(**fields) -> dict:
    return {"type": "log", "seq": 2, "ts": 1000.0, "level": "info", "message": "x", **fields}


@pytest.mark.parametrize("body, error", [
    ('{"events": [{"type": "log", "seq": ' + "9" * 5000 + "}]}", "no event can hold"),
    ('{"events": ' + "[" * 100_000 + "]" * 100_000 + "}", "nests JSON too deeply"),
])
def test_json_a_server_should_not_parse_is_a_400(client, run, token, body, error):
    response = post_body(client, run.pk, body, token=token)

    assert response.status_code == 400 and error in response.json()["error"]


@pytest.mark.parametrize("bad, field", [
    ({"type": "checkpoint.saved", "seq": 2, "ts": 1e300, "step": 1, "version": 1,
      "path": "/c", "fingerprint": "f"}, "checkpoint.saved.ts"),
    ({"type": "span", "seq": 2, "ts": 1000.0, "device": "cpu:0", "phase": "rollout",
      "start": 1e306, "end": 1e306, "step": 1, "version": 1}, "span.start"),
    ({"type": "span", "seq": 2, "ts": 1000.0, "device": "cpu:0", "phase": "rollout",
      "start": 10.0, "end": -1.0, "step": 1, "version": 1}, "span.end"),
    ({"type": "metrics.append", "seq": 2, "ts": 1000.0, "step": 1,
      "values": {f"m{i}": 1.0 for i in range(60_000)}}, "metrics.append.values"),
    ({"type": "metrics.append", "seq": 2, "ts": 1000.0, "step": 1,
      "values": {"n" * 5000: 1.0}}, "metrics.append.values"),
    (hostile(message="x" * 200_000), "log.message"),
    (hostile(message="a\x00b"), "log.message"),
    (hostile(level="info\x00"), "log.level"),
])
def test_each_unbounded_value_is_refused_by_name_and_the_rest_is_stored(
        client, run, token, bad, field):
    response = post_events(client, run, token, [log(1), bad, span(3, 1)])

    assert response.status_code == 400
    [error] = response.json()["errors"]
    assert error["seq"] == 2 and error["error"].startswith(field + ":")
    assert list(RunEvent.backfill(run).values_list("seq", flat=True)) == [1, 3]
    assert PhaseSpan.objects.filter(run=run).count() == 1
    assert not Checkpoint.objects.exists()


def test_a_seq_far_past_the_runs_highest_is_refused_so_the_live_stream_goes_on(
        client, run, token):
    post_events(client, run, token, [log(1), log(2)])

    response = post_events(client, run, token, [log(3), hostile(seq=2**53 - 1)])

    assert response.status_code == 400
    [error] = response.json()["errors"]
    assert error["seq"] == 2**53 - 1 and error["error"].startswith("log.seq:")
    assert "highest stored seq (2)" in error["error"]
    assert post_events(client, run, token, [log(4)]).json()["last_seq"] == 4


def test_a_seq_within_the_bound_of_a_gap_is_stored(client, run, token):
    """The engine's own gaps (events it set aside, or lost in memory in a crash)."""
    post_events(client, run, token, [log(1)])

    response = post_events(client, run, token, [log(1 + MAX_SEQ_AHEAD)])

    assert response.status_code == 200 and response.json()["last_seq"] == 1 + MAX_SEQ_AHEAD


def test_a_plausible_checkpoint_time_is_stored(client, run, token):
    assert post_events(client, run, token, [checkpoint(1, 5)]).status_code == 200
    assert Checkpoint.objects.get(run=run).step == 5


def test_the_engine_cuts_its_own_messages_to_what_ingest_takes():
    long = LogEvent(message="y" * (3 * LOG_MESSAGE_LIMIT) + "the end\x00")
    status = RunStatusEvent(status="failed", message="z" * (2 * LOG_MESSAGE_LIMIT))

    assert len(long.message) <= LOG_MESSAGE_LIMIT and len(status.message) <= LOG_MESSAGE_LIMIT
    assert long.message.startswith("[") and long.message.endswith("the end\\0")
    assert "\x00" not in long.message


# --- bodies bounded before Django reads them ---------------------------------------------

def asgi_post(path: str, headers: dict[bytes, bytes], body: bytes = b"") -> tuple[int, dict]:
    """One POST through the deployed ASGI application; also says whether the body was
    read at all."""
    sent, read = [], []

    async def receive():
        read.append(True)
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(),
             "query_string": b"", "headers": list(headers.items()), "scheme": "http",
             "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 5000),
             "asgi": {"version": "3.0"}, "http_version": "1.1", "root_path": ""}
    asyncio.run(application(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {"body_read": bool(read), **json.loads(body or b"{}")}


def test_a_body_declared_over_the_limit_is_413_without_being_read(settings):
    status, answer = asgi_post("/api/runs/1/events", {
        b"content-length": str(settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1).encode(),
        b"authorization": b"Bearer whatever", b"host": b"127.0.0.1"})

    assert status == 413 and not answer["body_read"]
    status, answer = asgi_post("/api/v1/runs", {  # the REST API's error shape there
        b"content-length": str(settings.DATA_UPLOAD_MAX_MEMORY_SIZE + 1).encode(),
        b"host": b"127.0.0.1"})
    assert status == 413 and "over" in answer["detail"]


def test_an_ingest_post_without_a_token_is_401_without_its_body_being_read():
    status, answer = asgi_post("/api/runs/1/events", {
        b"content-length": b"1000000", b"host": b"127.0.0.1"})

    assert status == 401 and not answer["body_read"]
    assert "Authorization: Bearer" in answer["error"]


def test_a_run_cannot_report_more_distinct_metric_names_than_the_cap(client, run, token,
                                                                     settings):
    from jobs.models import MetricPoint
    from jobs.prometheus import INGEST_EVENTS

    settings.RLPLANE_MAX_METRIC_NAMES = 3
    refused_before = INGEST_EVENTS.labels("over_name_cap")._value.get()
    events = [{"type": "metrics.append", "seq": 1, "ts": 1.0, "step": 1,
               "values": {"reward/mean": 0.1, "a": 1.0}},
              {"type": "metrics.append", "seq": 2, "ts": 2.0, "step": 2,
               "values": {"b": 1.0, "c": 2.0}},                  # 4 names: refused whole
              {"type": "metrics.append", "seq": 3, "ts": 3.0, "step": 3,
               "values": {"reward/mean": 0.2, "b": 1.0}}]        # 3 names: stored

    response = post_events(client, run, token, events)

    assert response.status_code == 400 and response.json()["stored"] == 2, response.json()
    [error] = response.json()["errors"]
    assert error["seq"] == 2 and "the cap is 3 (RLPLANE_MAX_METRIC_NAMES)" in error["error"]
    assert sorted(set(MetricPoint.objects.filter(run=run).values_list("name", flat=True))) \
        == ["a", "b", "reward/mean"]
    assert INGEST_EVENTS.labels("over_name_cap")._value.get() == refused_before + 1


def test_a_batch_reads_its_metric_names_highest_steps_once(client, run, token):
    """The name cap's check and the points (which buckets close, whether a step is new)
    share one read, under the run's lock."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def batch(seq):
        return [{"type": "metrics.append", "seq": seq + i, "ts": 1.0, "step": seq + i,
                 "values": {"reward/mean": 0.1, "loss": 2.0}} for i in range(12)]

    post_events(client, run, token, batch(1))
    with CaptureQueriesContext(connection) as queries:
        assert post_events(client, run, token, batch(13)).status_code == 200

    assert len([q for q in queries.captured_queries
                if "MAX" in q["sql"] and "metricpoint" in q["sql"]]) == 1


def test_a_batch_naming_thousands_of_new_metrics_is_refused_without_a_500(client, run, token,
                                                                          settings):
    settings.RLPLANE_MAX_METRIC_NAMES = 100
    events = [{"type": "metrics.append", "seq": i + 1, "ts": 1.0, "step": i + 1,
               "values": {f"m{i}_{j}": 1.0 for j in range(2000)}} for i in range(20)]

    response = post_events(client, run, token, events)

    assert response.status_code == 400 and response.json()["stored"] == 0
    errors = response.json()["errors"]
    assert len(errors) == 20 and all("the cap is 100" in e["error"] for e in errors), errors[0]
