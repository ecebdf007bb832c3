import asyncio
import json
import threading

import pytest
from django.test import Client

from engine.api import RUN_STATUSES, WorkerReplacedEvent
from jobs.charts import REPLACED_COLOR
from jobs.consumers import run_update
from jobs.ingest.store import ENGINE_STATUS, broadcast_events
from jobs.models import Checkpoint, MetricPoint, PhaseSpan, Run, RunEvent, RunStatus
from jobs.queries.run_page import chart_data

from .helpers import checkpoint, log, metrics, post_body, post_events, span, status

S = RunStatus


def stored_seqs(run) -> list[int]:
    return list(RunEvent.backfill(run).values_list("seq", flat=True))


# --- auth ---------------------------------------------------------------------------------

def test_a_request_without_a_token_is_401(client, run, token):
    response = post_body(client, run.pk, '{"events": []}')

    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"
    assert "Authorization: Bearer" in response.json()["error"]


@pytest.mark.parametrize("header", ["Basic dXNlcjpwYXNz", "Bearer", "Bearer   ", "token"])
def test_a_malformed_authorization_header_is_401(client, run, token, header):
    response = client.post(f"/api/runs/{run.pk}/events", data='{"events": []}',
                           content_type="application/json", headers={"Authorization": header})

    assert response.status_code == 401


def test_another_runs_token_is_403_and_stores_nothing(client, make_run, run, token):
    other_token = make_run(name="other").issue_ingest_token()

    response = post_events(client, run, other_token, [log(1)])

    assert response.status_code == 403
    assert not RunEvent.objects.exists()


def test_an_unknown_run_is_404(client, run, token):
    response = post_body(client, run.pk + 1000, '{"events": []}', token=token)

    assert response.status_code == 404
    assert "does not exist" in response.json()["error"]


def test_ingest_needs_no_csrf_token_and_only_accepts_post(run, token):
    client = Client(enforce_csrf_checks=True)

    assert post_events(client, run, token, [log(1)]).status_code == 200
    assert client.get(f"/api/runs/{run.pk}/events").status_code == 405


# --- malformed and partly bad batches -----------------------------------------------------

def test_a_body_that_is_not_json_is_400_with_a_message(client, run, token):
    response = post_body(client, run.pk, "{events: oops", token=token)

    assert response.status_code == 400
    assert response.json()["error"].startswith("the body is not JSON")


def test_a_body_without_an_events_list_is_400_with_a_message(client, run, token):
    response = post_body(client, run.pk, '{"event": []}', token=token)

    assert response.status_code == 400
    assert '{"events": [event, ...]}' in response.json()["error"]


def test_a_body_over_the_upload_limit_is_413(client, run, token, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000

    response = post_events(client, run, token, [log(i + 1, "x" * 100) for i in range(20)])

    assert response.status_code == 413
    assert "fewer events" in response.json()["error"]
    assert not RunEvent.objects.exists()


def test_a_partly_bad_batch_stores_every_good_event_and_names_the_bad_ones(client, run, token):
    bad_type = {**log(2).to_dict(), "type": "nope"}
    bad_seq = {**log(4).to_dict(), "seq": 0}

    response = post_events(client, run, token,
                           [metrics(1, 0, loss=1.0), bad_type, log(3), bad_seq, span(5, 0)])

    assert response.status_code == 400
    body = response.json()
    assert (body["stored"], body["duplicates"], body["last_seq"]) == (3, 0, 5)
    assert [(e["index"], e["seq"]) for e in body["errors"]] == [(1, 2), (3, 0)]
    assert "unknown event type 'nope'" in body["errors"][0]["error"]
    assert stored_seqs(run) == [1, 3, 5]
    assert MetricPoint.objects.count() == 1 and PhaseSpan.objects.count() == 1


def test_an_empty_batch_is_fine(client, run, token):
    response = post_events(client, run, token, [])

    assert response.json() == {"stored": 0, "duplicates": 0, "last_seq": 0}


# --- idempotency and order ----------------------------------------------------------------

def test_a_replayed_batch_stores_nothing_twice(client, run, token):
    batch = [metrics(1, 0, loss=1.0, reward=0.1), span(2, 0), checkpoint(3, 0), log(4)]
    first = post_events(client, run, token, batch)

    replay = post_events(client, run, token, batch)

    assert first.json() == {"stored": 4, "duplicates": 0, "last_seq": 4}
    assert replay.json() == {"stored": 0, "duplicates": 4, "last_seq": 4}
    assert stored_seqs(run) == [1, 2, 3, 4]
    counts = (MetricPoint.objects.count(), PhaseSpan.objects.count(), Checkpoint.objects.count())
    assert counts == (2, 1, 1)


def test_a_run_deleted_after_its_token_was_checked_gets_no_rows_and_a_404(
        client, run, token, monkeypatch):
    """The event tables keep no foreign key to the run (jobs/models/series.py): ingest
    finds the run under its lock or stores nothing."""
    from jobs.ingest import endpoints

    checked = endpoints.run_for_token

    def deleted_meanwhile(request, run_id):
        found = checked(request, run_id)
        Run.objects.filter(pk=run_id).delete()
        return found
    monkeypatch.setattr(endpoints, "run_for_token", deleted_meanwhile)

    response = post_events(client, run, token, [metrics(1, 0, loss=1.0), span(2, 0)])

    assert response.status_code == 404 and "does not exist" in response.json()["error"]
    assert not RunEvent.objects.filter(run_id=run.pk).exists()
    assert not MetricPoint.objects.filter(run_id=run.pk).exists()
    assert not PhaseSpan.objects.filter(run_id=run.pk).exists()


def test_a_batch_that_overlaps_what_is_stored_adds_only_the_new_seqs(client, run, token):
    post_events(client, run, token, [span(1, 0), span(2, 0, device="cpu:1")])

    response = post_events(client, run, token, [span(2, 0, device="cpu:1"), span(3, 1)])

    assert response.json() == {"stored": 1, "duplicates": 1, "last_seq": 3}
    assert PhaseSpan.objects.count() == 3


def test_a_seq_repeated_within_one_batch_is_stored_once(client, run, token):
    response = post_events(client, run, token, [log(1, "first"), log(1, "again")])

    assert response.json() == {"stored": 1, "duplicates": 1, "last_seq": 1}
    assert RunEvent.objects.get().payload["message"] == "first"


def test_out_of_order_seqs_are_stored_and_backfill_returns_them_in_seq_order(
        client, run, token):
    post_events(client, run, token, [log(5), log(3)])
    response = post_events(client, run, token, [log(4), log(1), log(2)])

    assert response.json()["last_seq"] == 5
    assert stored_seqs(run) == [1, 2, 3, 4, 5]
    assert list(RunEvent.backfill(run, after_seq=2).values_list("seq", flat=True)) == [3, 4, 5]


def test_each_run_has_its_own_seqs(client, make_run, run, token):
    other = make_run(name="other")
    other_token = other.issue_ingest_token()

    post_events(client, run, token, [log(1)])
    response = post_events(client, other, other_token, [log(1)])

    assert response.json()["stored"] == 1
    assert stored_seqs(other) == [1]


# --- derived rows -------------------------------------------------------------------------

def test_metrics_become_one_point_per_name_and_step(client, run, token):
    post_events(client, run, token, [metrics(1, 0, **{"reward/mean": 0.25, "time/step_s": 2.0}),
                                     metrics(2, 1, **{"reward/mean": 0.5})])

    points = MetricPoint.objects.filter(run=run).order_by("name", "step")
    assert [(p.name, p.step, p.value) for p in points] == [
        ("reward/mean", 0, 0.25), ("reward/mean", 1, 0.5), ("time/step_s", 0, 2.0)]


def test_a_step_reported_again_by_a_resumed_run_takes_the_later_value(client, run, token):
    post_events(client, run, token, [metrics(1, 3, loss=9.0)])

    post_events(client, run, token, [metrics(2, 3, loss=1.0), metrics(3, 3, loss=0.5)])

    assert MetricPoint.objects.get(run=run, name="loss", step=3).value == 0.5


def test_a_batch_redoing_a_stored_step_among_new_ones_stores_each_once(client, run, token):
    post_events(client, run, token, [metrics(1, 3, loss=9.0), metrics(2, 4, loss=8.0)])

    # loss at 3 again (stored), at 5 (new), and a new name below loss's highest step
    post_events(client, run, token, [metrics(3, 3, loss=1.0), metrics(4, 5, loss=0.5),
                                     metrics(5, 2, kl=0.1)])

    assert sorted(MetricPoint.objects.filter(run=run).values_list("name", "step", "value")) == [
        ("kl", 2, 0.1), ("loss", 3, 1.0), ("loss", 4, 8.0), ("loss", 5, 0.5)]


def test_a_nan_metric_is_stored_as_null_in_the_series_and_the_event(client, run, token):
    raw = ('{"events": [{"type": "metrics.append", "seq": 1, "ts": 1.0, "step": 0,'
           ' "values": {"learner/loss": NaN, "reward/mean": 0.5}}]}')

    response = post_body(client, run.pk, raw, token=token)

    assert response.status_code == 200
    assert MetricPoint.objects.get(name="learner/loss").value is None
    assert RunEvent.objects.get().payload["values"] == {"learner/loss": None, "reward/mean": 0.5}


def test_spans_become_phase_spans(client, run, token):
    post_events(client, run, token, [span(1, 4, device="cpu:1", phase="learner")])

    s = PhaseSpan.objects.get(run=run)
    assert (s.device, s.phase, s.start, s.end, s.step, s.version) == (
        "cpu:1", "learner", 14.0, 14.5, 4, 4)


def test_a_saved_checkpoint_is_listed_for_the_run(client, run, token):
    post_events(client, run, token, [checkpoint(1, 10)])

    c = Checkpoint.objects.get(run=run)
    assert (c.step, c.version, c.path, c.fingerprint) == (10, 10, "/ckpt/step_000010", "fp10")
    assert c.created_at.timestamp() == 1001.0


def test_a_replaced_worker_is_marked_on_the_charts_at_load_and_live(client, run, token):
    event = WorkerReplacedEvent(seq=1, ts=1001.0, step=3, worker=1, cause="its process died",
                                version=3, fingerprint_learner="fp3", fingerprint_worker="fp3")

    post_events(client, run, token, [event])

    mark = {"step": 3, "label": "worker 1 replaced", "color": REPLACED_COLOR}
    assert chart_data(run)["marks"] == [mark]
    assert run_update([event.to_dict()], status=None)["marks"] == [mark]


def test_a_restarted_driver_is_listed_and_marked_and_its_statuses_keep_the_run_running(
        client, operator, make_run):
    run = make_run(S.RUNNING, status_reason="driver restarted (1 of 1, run.max_restarts): "
                   "the run's driver was killed (SIGKILL)", restarts=[
                       {"at": "2026-12-03T16:00:00+00:00", "job": "rlplane-run-1", "step": 19,
                        "cause": "the run's driver was killed (SIGKILL) before it could report"}])
    token = run.issue_ingest_token()

    # the resumed driver says what a first start says, after the events it continues
    post_events(client, run, token, [status(1, "starting"), status(2, "warm_start"),
                                     status(3, "running")])

    run.refresh_from_db()
    assert run.status == S.RUNNING and run.status_reason.startswith("driver restarted")
    assert chart_data(run)["marks"] == [{"step": 19, "label": "driver restarted",
                                         "color": REPLACED_COLOR}]
    page = operator.get(f"/runs/{run.pk}").content.decode()
    assert "Driver restarted (1 of 1) after step 19: the run&#x27;s driver was killed" in page


def test_every_event_is_kept_verbatim_as_a_run_event(client, run, token):
    event = log(1, "warm start done")

    post_events(client, run, token, [event])

    stored = RunEvent.objects.get()
    assert (stored.seq, stored.type, stored.ts) == (1, "log", 1001.0)
    assert stored.payload == event.to_dict()


# --- status -------------------------------------------------------------------------------

def test_every_engine_status_has_a_run_status():
    assert set(ENGINE_STATUS) == set(RUN_STATUSES)


def test_engine_statuses_move_a_submitted_run_to_running_then_succeeded(
        client, make_run):
    run = make_run(S.SUBMITTING)
    token = run.issue_ingest_token()

    post_events(client, run, token, [status(1, "starting"), status(2, "warm_start")])
    run.refresh_from_db()
    assert (run.status, run.status_reason) == (S.RUNNING, "")
    assert run.started_at is not None

    post_events(client, run, token, [status(3, "running"), status(4, "succeeded", "10 steps")])
    run.refresh_from_db()
    assert (run.status, run.status_reason) == (S.SUCCEEDED, "10 steps")
    assert run.finished_at is not None


def test_an_engine_failure_becomes_the_runs_reason(client, run, token):
    post_events(client, run, token, [status(1, "failed", "CUDA out of memory")])

    run.refresh_from_db()
    assert (run.status, run.status_reason) == (S.FAILED, "CUDA out of memory")


def test_a_run_stopped_on_request_follows_the_engine_to_stopped(client, make_run):
    run = make_run(S.STOPPING, status_reason="operator asked")
    token = run.issue_ingest_token()

    post_events(client, run, token, [status(1, "stopped", "checkpointed at step 4")])

    run.refresh_from_db()
    # who asked, and where the engine stopped
    assert (run.status, run.status_reason) == (S.STOPPED, "operator asked; checkpointed at step 4")


def test_an_engine_that_stops_on_its_own_passes_through_stopping(client, run, token):
    post_events(client, run, token, [status(1, "stopped", "STOP file")])

    run.refresh_from_db()
    assert (run.status, run.status_reason) == (S.STOPPED, "STOP file")


def test_an_end_reported_before_running_walks_the_run_through_running(client, make_run):
    run = make_run(S.SUBMITTING)  # its "running" batch is still in the driver's spool
    token = run.issue_ingest_token()

    post_events(client, run, token, [status(5, "succeeded", "10 steps")])

    run.refresh_from_db()
    assert (run.status, run.status_reason) == (S.SUCCEEDED, "10 steps")
    assert run.started_at is not None


def test_a_status_the_state_machine_refuses_leaves_the_run_alone_but_keeps_the_event(
        client, make_run, caplog):
    run = make_run(S.LOST, status_reason="ray job vanished")
    token = run.issue_ingest_token()

    response = post_events(client, run, token, [status(1, "running")])

    assert response.status_code == 200
    run.refresh_from_db()
    assert (run.status, run.status_reason) == (S.LOST, "ray job vanished")
    assert RunEvent.objects.get(run=run).payload["status"] == "running"
    assert "ignored engine status 'running'" in caplog.text


def test_a_replayed_status_event_does_not_move_the_run_again(client, make_run):
    run = make_run(S.SUBMITTING)
    token = run.issue_ingest_token()
    post_events(client, run, token, [status(1, "running")])
    Run.objects.get(pk=run.pk).transition_to(S.STOPPING, "operator asked")

    post_events(client, run, token, [status(1, "running")])

    assert Run.objects.get(pk=run.pk).status == S.STOPPING


# --- broadcast ----------------------------------------------------------------------------

@pytest.fixture
def listener(channel_layer, run):
    """Receives the run group's next message: a channel in it, on an event loop of its
    own thread (a pub/sub subscription lives with the loop that made it, and each
    async_to_sync call here would run on a new one)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def call(coroutine):   # a deadline, so a lost message fails instead of hanging
        return asyncio.run_coroutine_threadsafe(
            asyncio.wait_for(coroutine, timeout=10), loop).result()

    channel = call(channel_layer.new_channel())
    call(channel_layer.group_add(f"run.{run.pk}", channel))
    yield lambda: call(channel_layer.receive(channel))
    call(channel_layer.group_discard(f"run.{run.pk}", channel))
    call(channel_layer.flush())
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)
    loop.close()


def test_newly_stored_events_are_group_sent_in_seq_order_after_commit(
        client, run, token, listener, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        post_events(client, run, token, [log(2), metrics(1, 0, loss=float("nan"))])
    sends = [c for c in callbacks if getattr(c, "func", None) is broadcast_events]
    assert len(sends) == 1  # nothing is sent until the transaction commits
    sends[0]()

    message = listener()

    assert message["type"] == "run.events" and message["run_id"] == run.pk
    assert [e["seq"] for e in message["events"]] == [1, 2]
    assert message["events"][0]["values"] == {"loss": None}
    assert message["events"][1] == log(2).to_dict()
    assert json.loads(json.dumps(message["events"], allow_nan=False))  # browser-safe JSON


def test_broadcasts_from_many_threads_share_one_running_loop(run, listener, channel_layer,
                                                             monkeypatch):
    """Ingest's threads send on the process's one loop, whose channel layer keeps its
    Redis connection: a loop per send connected again each time (~3 ms a batch)."""
    loops = []
    real = channel_layer.group_send

    async def recording(group, message):
        loops.append(asyncio.get_running_loop())
        await real(group, message)

    monkeypatch.setattr(channel_layer, "group_send", recording)
    for seq in (1, 2, 3):
        thread = threading.Thread(
            target=broadcast_events, args=(run.pk, [log(seq).to_dict()], {"type": "x"}))
        thread.start()
        thread.join(timeout=10)

    assert [listener()["events"][0]["seq"] for _ in range(3)] == [1, 2, 3]
    assert len(loops) == 6 and len(set(loops)) == 1 and loops[0].is_running()


def test_the_send_loop_starts_again_if_its_thread_ended(run, listener):
    from jobs import groups

    ended = groups.send_loop()
    ended.call_soon_threadsafe(ended.stop)
    groups._thread.join(timeout=10)

    broadcast_events(run.pk, [log(1).to_dict()])

    assert listener()["events"][0]["seq"] == 1 and groups.send_loop() is not ended


def test_a_replay_is_not_broadcast_again(
        client, run, token, listener, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        post_events(client, run, token, [log(1)])
        post_events(client, run, token, [log(1)])
        post_events(client, run, token, [log(1), log(2)])

    first, second = listener(), listener()

    assert [e["seq"] for e in first["events"]] == [1]
    assert [e["seq"] for e in second["events"]] == [2]
