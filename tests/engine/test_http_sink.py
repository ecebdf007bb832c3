"""HttpSink against the real ingest endpoint (pytest-django's live_server), reached through
a small stdlib proxy that the tests take down and bring back on the same port
(tests/ingest_gate.py)."""

import json
import time
from dataclasses import dataclass
from typing import ClassVar

import pytest

from engine.api import Event, LogEvent, MetricsEvent
from engine.telemetry.http_sink import POISON_AFTER, HttpSink
from jobs.models import MetricPoint, Run, RunEvent
from tests.ingest_gate import Gate

pytestmark = pytest.mark.django_db(transaction=True)


@dataclass
class BogusEvent(Event):
    type: ClassVar[str] = "bogus"


def wait_until(predicate, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


def event(seq: int) -> Event:
    if seq % 3 == 0:
        return MetricsEvent(seq=seq, ts=float(seq), step=seq, values={"reward/mean": seq / 10})
    return LogEvent(seq=seq, ts=float(seq), message=f"event {seq}")


def stored_seqs(run: Run) -> list[int]:
    return list(RunEvent.backfill(run).values_list("seq", flat=True))


def spooled_seqs(sink: HttpSink) -> list[int]:
    """The seqs in the spool; a last line still being written is not counted yet."""
    if not sink.spool_path.exists():
        return []
    seqs = []
    for line in sink.spool_path.read_text().splitlines():
        try:
            seqs.append(json.loads(line)["seq"])
        except ValueError:
            pass
    return seqs


def first_arrivals(seqs: list[int]) -> list[int]:
    seen: set[int] = set()
    return [s for s in seqs if not (s in seen or seen.add(s))]


@pytest.fixture
def run_and_token():
    run = Run.objects.create(name="sink test", config={})
    return run, run.issue_ingest_token()


@pytest.fixture
def gate(live_server):
    gate = Gate(live_server.url).up()
    yield gate
    if gate._server is not None:
        gate.down()


def make_sink(gate, run_and_token, tmp_path, **options) -> HttpSink:
    run, token = run_and_token
    options = {"batch_size": 7, "flush_interval_s": 0.05, "min_backoff_s": 0.02,
               "max_backoff_s": 0.2, **options}
    return HttpSink(gate.url(run), token, tmp_path / "spool.jsonl", **options)


def test_events_arrive_in_emit_order_in_batches_and_are_stored_once(
        gate, run_and_token, tmp_path):
    run, _ = run_and_token
    sink = make_sink(gate, run_and_token, tmp_path)

    for seq in range(1, 41):
        sink.emit(event(seq))

    assert sink.close(timeout_s=30)
    assert stored_seqs(run) == list(range(1, 41))
    assert gate.seqs_in_arrival_order() == list(range(1, 41))
    assert all(1 <= len(batch) <= 7 for batch in gate.batches)
    assert MetricPoint.objects.filter(run=run).count() == 13
    assert not sink.spool_path.exists()


def test_while_the_control_plane_is_down_events_are_spooled_then_replayed_before_newer_ones(
        gate, run_and_token, tmp_path):
    run, _ = run_and_token
    gate.down()
    sink = make_sink(gate, run_and_token, tmp_path)

    for seq in range(1, 31):
        sink.emit(event(seq))
    wait_until(lambda: spooled_seqs(sink) == list(range(1, 31)), "all 30 events are spooled")
    gate.up()
    for seq in range(31, 41):
        sink.emit(event(seq))

    assert sink.close(timeout_s=30)
    assert stored_seqs(run) == list(range(1, 41))
    assert first_arrivals(gate.seqs_in_arrival_order()) == list(range(1, 41))
    assert MetricPoint.objects.filter(run=run).count() == 13
    assert not sink.spool_path.exists()


def test_an_outage_in_the_middle_of_a_run_loses_and_duplicates_nothing(
        gate, run_and_token, tmp_path):
    run, _ = run_and_token
    sink = make_sink(gate, run_and_token, tmp_path)
    for seq in range(1, 21):
        sink.emit(event(seq))
    # Polled through the gate, not the database: SQLite's shared in-memory test database
    # refuses a read while the live server writes.
    wait_until(lambda: gate.seqs_in_arrival_order()[-1:] == [20], "the first 20 are delivered")

    gate.down()
    for seq in range(21, 41):
        sink.emit(event(seq))
    wait_until(lambda: spooled_seqs(sink)[-1:] == [40], "the events up to 40 are spooled")
    gate.up()
    for seq in range(41, 51):
        sink.emit(event(seq))

    assert sink.close(timeout_s=30)
    assert stored_seqs(run) == list(range(1, 51))
    assert first_arrivals(gate.seqs_in_arrival_order()) == list(range(1, 51))
    assert MetricPoint.objects.filter(run=run).count() == 16


def test_events_the_server_refuses_are_set_aside_without_a_retry_loop(
        gate, run_and_token, tmp_path, caplog):
    run, _ = run_and_token
    sink = make_sink(gate, run_and_token, tmp_path, batch_size=50, flush_interval_s=0.5)

    for seq in (1, 2):
        sink.emit(event(seq))
    sink.emit(BogusEvent(seq=3, ts=3.0))
    sink.emit(event(4))

    assert sink.close(timeout_s=30)
    assert stored_seqs(run) == [1, 2, 4]
    assert sorted(gate.seqs_in_arrival_order()) == [1, 2, 3, 4]  # each sent exactly once
    assert "the server refused event 3 (400: unknown event type 'bogus'" in caplog.text
    [aside] = [json.loads(line) for line in sink.rejected_path.read_text().splitlines()]
    assert aside["event"]["seq"] == 3 and "unknown event type" in aside["reason"]
    assert sink.set_aside == 1


def test_an_event_the_server_cannot_store_is_set_aside_not_retried_forever(
        gate, run_and_token, tmp_path, monkeypatch):
    """A server error on one event (before the bounds of issue 19, e.g. a checkpoint ts of
    1e300) once held back every later event of the run, retried forever."""
    import jobs.ingest.endpoints

    run, _ = run_and_token
    store = jobs.ingest.endpoints.do_ingest_events

    def fails_on_seq_3(run, events, **kwargs):
        if any(e.seq == 3 for e in events):
            raise RuntimeError("cannot store seq 3")
        return store(run, events, **kwargs)

    monkeypatch.setattr(jobs.ingest.endpoints, "do_ingest_events", fails_on_seq_3)
    sink = make_sink(gate, run_and_token, tmp_path, batch_size=50, flush_interval_s=0.3)
    for seq in range(1, 7):
        sink.emit(event(seq))

    assert sink.close(timeout_s=30)
    assert stored_seqs(run) == [1, 2, 4, 5, 6]
    assert sink.set_aside == 1
    [aside] = [json.loads(line) for line in sink.rejected_path.read_text().splitlines()]
    assert aside["event"]["seq"] == 3 and aside["reason"].startswith("500")
    assert not sink.spool_path.exists()


def test_a_batch_too_large_for_the_server_is_split_until_it_fits(
        gate, run_and_token, tmp_path, settings):
    run, _ = run_and_token
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1500  # ~15 of these events per request
    sink = make_sink(gate, run_and_token, tmp_path, batch_size=60, flush_interval_s=1.0)

    for seq in range(1, 61):
        sink.emit(LogEvent(seq=seq, ts=1.0, message="x" * 40))

    assert sink.close(timeout_s=30)
    assert stored_seqs(run) == list(range(1, 61))
    assert any(len(batch) == 60 for batch in gate.batches)  # refused whole, then split


def test_close_leaves_undelivered_events_in_the_spool_for_the_next_sink(
        gate, run_and_token, tmp_path):
    run, _ = run_and_token
    gate.down()
    sink = make_sink(gate, run_and_token, tmp_path)
    for seq in range(1, 11):
        sink.emit(event(seq))

    assert not sink.close(timeout_s=0.3)
    assert spooled_seqs(sink) == list(range(1, 11))

    gate.up()
    resumed = make_sink(gate, run_and_token, tmp_path)  # e.g. the driver restarted
    for seq in (11, 12):
        resumed.emit(event(seq))

    assert resumed.close(timeout_s=30)
    assert stored_seqs(run) == list(range(1, 13))
    assert first_arrivals(gate.seqs_in_arrival_order()) == list(range(1, 13))


def test_a_torn_last_line_left_by_a_crash_is_skipped_and_the_rest_delivered(
        gate, run_and_token, tmp_path, caplog):
    run, _ = run_and_token
    lines = [json.dumps(event(seq).to_dict()) for seq in (1, 2, 3, 4)]
    (tmp_path / "spool.jsonl").write_text("\n".join(lines[:3]) + "\n" + lines[3][:20])

    sink = make_sink(gate, run_and_token, tmp_path)
    sink.emit(event(5))

    assert sink.close(timeout_s=30)
    assert stored_seqs(run) == [1, 2, 3, 5]
    assert "skipping a torn line" in caplog.text


def test_a_token_the_server_rejects_keeps_the_events_in_the_spool(
        gate, run_and_token, tmp_path):
    run, _ = run_and_token
    sink = HttpSink(gate.url(run), "not-the-token", tmp_path / "spool.jsonl",
                    batch_size=7, flush_interval_s=0.05, min_backoff_s=0.02, max_backoff_s=0.2)
    for seq in range(1, 6):
        sink.emit(event(seq))
    wait_until(lambda: spooled_seqs(sink) == [1, 2, 3, 4, 5], "the refused events are spooled")

    assert not sink.close(timeout_s=0.2)
    assert spooled_seqs(sink) == [1, 2, 3, 4, 5]
    assert not RunEvent.objects.exists()


def test_emit_after_close_is_an_error(gate, run_and_token, tmp_path):
    sink = make_sink(gate, run_and_token, tmp_path)
    assert sink.close(timeout_s=5)

    with pytest.raises(RuntimeError, match="after close"):
        sink.emit(event(1))


def test_a_400_that_is_not_from_the_ingest_endpoint_is_retried_not_dropped(
        gate, run_and_token, tmp_path, settings):
    run, _ = run_and_token
    settings.ALLOWED_HOSTS = ["elsewhere.example"]  # Django answers 400 DisallowedHost
    sink = make_sink(gate, run_and_token, tmp_path)
    for seq in range(1, 4):
        sink.emit(event(seq))
    wait_until(lambda: spooled_seqs(sink) == [1, 2, 3], "the refused batch is spooled")

    settings.ALLOWED_HOSTS = ["*"]

    assert sink.close(timeout_s=30)
    assert stored_seqs(run) == [1, 2, 3]


def test_a_server_that_answers_500_even_to_an_empty_batch_keeps_the_batch_for_later(
        gate, run_and_token, tmp_path):
    """Its database away, say: the batch is not at fault, so it is not split and set aside
    after POISON_AFTER 500s (as an event the server cannot store would be)."""
    run, _ = run_and_token
    sink = make_sink(gate, run_and_token, tmp_path)
    gate.failing = True
    for seq in range(1, 4):
        sink.emit(event(seq))
    for _ in range(2 * POISON_AFTER):       # each flush is one more attempt at least
        assert not sink.flush(timeout_s=30)
    gate.failing = False

    assert sink.close(timeout_s=30)
    assert stored_seqs(run) == [1, 2, 3]
    assert sink.set_aside == 0
