"""The live sockets, through the real ASGI stack (origin check, session auth, routing) and
the real Redis channel layer; events enter through do_ingest_events as ingest stores them."""

import asyncio
import threading

import pytest
from channels.db import database_sync_to_async
from django.test import Client
from django.utils import timezone

from controlplane.asgi import application
from engine.api import ControlAppliedEvent
from jobs import consumers, socket_logins
from jobs.alerts.lifecycle import broadcast_alerts
from jobs.consumers import RunConsumer, run_update
from jobs.groups import run_group
from jobs.ingest import store
from jobs.ingest.store import do_ingest_events
from jobs.models import Alert, RunControl

from .helpers import checkpoint, log, metrics, span, status
from .sockets import (
    HOST,
    WebsocketCommunicator,
    ingest,
    open_socket,
    received_until,
    run_async,
    seqs,
)

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_anonymous_socket_is_closed(run, channel_layer):
    async def scenario():
        return await open_socket(f"/ws/runs/{run.pk}/")

    communicator, connected, code = run_async(scenario)

    assert (connected, code) == (False, 4401)


def test_an_anonymous_runs_list_socket_is_closed(channel_layer):
    async def scenario():
        return await open_socket("/ws/runs/")

    _, connected, code = run_async(scenario)

    assert (connected, code) == (False, 4401)


def test_a_socket_from_another_origin_is_refused(run, channel_layer, session_cookie):
    async def scenario():
        communicator = WebsocketCommunicator(
            application, f"/ws/runs/{run.pk}/",
            headers=[(b"origin", b"http://evil.example"), HOST, session_cookie])
        return await communicator.connect(timeout=10)

    connected, _ = run_async(scenario)

    assert not connected


@pytest.mark.parametrize("origin", [b"http://localhost:9999", b"https://localhost", b"null"])
def test_a_socket_from_the_same_host_on_another_port_or_scheme_is_refused(
        run, channel_layer, session_cookie, origin):
    """Issue 19 item 9: the origin check once compared the host alone, so a page of any
    other local server could use the operator's cookie."""
    async def scenario():
        communicator = WebsocketCommunicator(
            application, f"/ws/runs/{run.pk}/", headers=[(b"origin", origin), HOST,
                                                         session_cookie])
        return await communicator.connect(timeout=10)

    connected, _ = run_async(scenario)

    assert not connected


def test_logging_out_closes_the_sockets_that_login_opened(run, channel_layer,
                                                          django_user_model):
    client = Client()
    client.force_login(django_user_model.objects.create_user("leaver"))
    cookie = (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())

    async def scenario():
        run_socket, connected, _ = await open_socket(f"/ws/runs/{run.pk}/", cookie)
        list_socket, listed, _ = await open_socket("/ws/runs/", cookie)
        assert connected and listed
        await database_sync_to_async(client.post)("/logout")
        closed = [await s.receive_output(timeout=10) for s in (run_socket, list_socket)]
        return closed

    closed = run_async(scenario)

    assert [m["type"] for m in closed] == ["websocket.close"] * 2
    assert {m.get("code") for m in closed} == {4401}


def test_a_socket_for_an_unknown_run_is_closed(run, channel_layer, session_cookie):
    async def scenario():
        return await open_socket(f"/ws/runs/{run.pk + 1000}/", session_cookie)

    _, connected, code = run_async(scenario)

    assert (connected, code) == (False, 4404)


def test_a_first_message_without_last_seq_gets_an_error_and_a_close(
        run, channel_layer, session_cookie):
    async def scenario():
        communicator, _, _ = await open_socket(f"/ws/runs/{run.pk}/", session_cookie)
        await communicator.send_json_to({"last": 3})
        reply = await communicator.receive_json_from(timeout=20)
        closed = await communicator.receive_output(timeout=10)
        return reply, closed

    reply, closed = run_async(scenario)

    assert "last_seq" in reply["error"]
    assert closed == {"type": "websocket.close", "code": 4400}


def test_a_client_is_backfilled_with_the_events_after_its_last_seq(
        run, channel_layer, session_cookie):
    do_ingest_events(run, [metrics(seq, seq, **{"reward/mean": seq / 10}) for seq in (1, 2, 3)]
                     + [log(4, "step done")])

    async def scenario():
        communicator, connected, _ = await open_socket(f"/ws/runs/{run.pk}/", session_cookie)
        assert connected
        await communicator.send_json_to({"last_seq": 1})
        messages = await received_until(communicator, 4)
        await communicator.disconnect(timeout=10)
        return messages

    messages = run_async(scenario)

    assert seqs(messages) == [2, 3, 4]
    reward = messages[0]["charts"]["reward"]
    assert reward["indices"] == [2] and reward["x"] == [[2, 3]] and reward["y"] == [[0.2, 0.3]]
    assert "step done" in messages[0]["append"]["run-logs"]


def test_a_reconnecting_client_gets_only_what_it_missed(run, channel_layer, session_cookie):
    do_ingest_events(run, [log(1), log(2)])

    async def scenario():
        first, _, _ = await open_socket(f"/ws/runs/{run.pk}/", session_cookie)
        await first.send_json_to({"last_seq": 0})
        before = await received_until(first, 2)
        await first.disconnect(timeout=10)
        await ingest(run, [log(3), log(4)])  # while the page was away
        second, _, _ = await open_socket(f"/ws/runs/{run.pk}/", session_cookie)
        await second.send_json_to({"last_seq": before[-1]["last_seq"]})
        after = await received_until(second, 4)
        await second.disconnect(timeout=10)
        return before, after

    before, after = run_async(scenario)

    assert seqs(before) == [1, 2]
    assert seqs(after) == [3, 4]


def test_live_events_follow_the_backfill_with_no_duplicate_or_gap(
        run, channel_layer, session_cookie):
    async def scenario():
        communicator, _, _ = await open_socket(f"/ws/runs/{run.pk}/", session_cookie)
        # Announced before the client said where it is: they must come from the backfill.
        await ingest(run, [metrics(1, 1, **{"reward/mean": 0.1}), log(2)])
        await communicator.send_json_to({"last_seq": 0})
        await ingest(run, [span(3, 1), status(4, "running")])
        await ingest(run, [log(2), span(3, 1), metrics(5, 2, **{"reward/mean": 0.2})])  # replay
        await ingest(run, [checkpoint(6, 2)])
        messages = await received_until(communicator, 6)
        assert await communicator.receive_nothing(timeout=0.5)
        await communicator.disconnect(timeout=10)
        return messages

    messages = run_async(scenario)

    assert seqs(messages) == [1, 2, 3, 4, 5, 6]
    merged = {k: v for m in messages for k, v in {**m["swap"], **m["append"]}.items()}
    assert 'id="run-status"' in merged["run-status"] and "running" in merged["run-status"]
    assert "step_000002" in merged["run-checkpoints"]


def test_broadcasts_that_cross_are_delivered_in_seq_order_once(
        run, channel_layer, session_cookie, monkeypatch):
    real_broadcast = database_sync_to_async(store.broadcast_events)
    held = []
    monkeypatch.setattr(store, "broadcast_events", lambda *args: held.append(args))

    async def scenario():
        communicator, _, _ = await open_socket(f"/ws/runs/{run.pk}/", session_cookie)
        await communicator.send_json_to({"last_seq": 0})
        await ingest(run, [log(1)])
        await ingest(run, [log(2)])
        # Two ingests' announcements arrive the wrong way round: 2 before 1.
        await real_broadcast(*held[1])
        await real_broadcast(*held[0])
        messages = await received_until(communicator, 2)
        assert await communicator.receive_nothing(timeout=0.5)
        await communicator.disconnect(timeout=10)
        return messages

    assert seqs(run_async(scenario)) == [1, 2]


def test_a_broadcast_reaches_a_socket_while_the_query_thread_is_busy(
        run, channel_layer, session_cookie, monkeypatch):
    """A message is not queued behind another socket's queries: channels' dispatch ran
    every handler after a hop onto the one query thread, and the session check (due
    before every message here) ran there too."""
    monkeypatch.setattr(socket_logins, "SESSION_CHECK_S", 0.0)
    gate = threading.Event()

    async def scenario():
        communicator, _, _ = await open_socket(f"/ws/runs/{run.pk}/", session_cookie)
        await ingest(run, [log(1)])
        await communicator.send_json_to({"last_seq": 0})
        await received_until(communicator, 1)            # the backfill
        await ingest(run, [log(2)])
        await received_until(communicator, 2)            # live: the socket is idle now
        busy = asyncio.ensure_future(database_sync_to_async(gate.wait)(30))  # a slow read
        await asyncio.sleep(0.2)
        try:
            await channel_layer.group_send(run_group(run.pk), {
                "type": "run.events", "run_id": run.pk,
                "events": [span(3, 1).to_dict()]})
            message = await communicator.receive_json_from(timeout=5)
        finally:
            gate.set()
            await busy
        await communicator.disconnect(timeout=10)
        return message

    assert seqs([run_async(scenario)]) == [3]


@pytest.fixture
def progress_reads(monkeypatch) -> list[int]:
    """The run ids whose progress a consumer read, in order."""
    made = []
    real = RunConsumer.progress_clock
    monkeypatch.setattr(RunConsumer, "progress_clock",
                        lambda self: made.append(self.run_id) or real(self))
    return made


def test_sockets_on_one_run_share_one_message_per_broadcast(
        run, channel_layer, session_cookie, progress_reads):
    made = progress_reads

    async def scenario():
        sockets = [(await open_socket(f"/ws/runs/{run.pk}/", session_cookie))[0]
                   for _ in range(3)]
        for communicator in sockets:
            await communicator.send_json_to({"last_seq": 0})
        await ingest(run, [metrics(1, 1, **{"reward/mean": 0.1})])
        received = [await received_until(communicator, 1) for communicator in sockets]
        for communicator in sockets:
            await communicator.disconnect(timeout=10)
        return received

    received = run_async(scenario)
    assert [seqs(messages) for messages in received] == [[1], [1], [1]]
    assert received[0] == received[1] == received[2]
    assert made == [run.pk]          # its queries and charts made once, not per socket


def test_a_burst_of_metrics_reads_the_runs_progress_once_and_counts_each_batchs_steps(
        run, channel_layer, session_cookie, progress_reads, monkeypatch):
    made = progress_reads
    monkeypatch.setattr(consumers, "PROGRESS_FRESH_S", 60.0)

    async def scenario():
        communicator, _, _ = await open_socket(f"/ws/runs/{run.pk}/", session_cookie)
        await communicator.send_json_to({"last_seq": 0})
        last = []
        for seq in (1, 2, 3):
            await ingest(run, [metrics(seq, seq - 1, **{"time/step_s": 1.0})])
            last.append((await received_until(communicator, seq))[-1])
        await communicator.disconnect(timeout=10)
        return last

    last = run_async(scenario)
    assert made == [run.pk]      # read once for the three broadcasts
    assert [m["progress"]["step"] for m in last] == [1, 2, 3]   # steps 0..k trained


def test_a_message_goes_with_the_last_progress_read_while_a_newer_one_is_made(
        run, channel_layer, session_cookie, monkeypatch):
    gate, made = threading.Event(), []
    real = RunConsumer.progress_clock

    def progress_clock(self):
        made.append(self.run_id)
        if len(made) > 1:
            gate.wait(30)   # a slow read: the database under ingest load
        return real(self)

    monkeypatch.setattr(RunConsumer, "progress_clock", progress_clock)
    monkeypatch.setattr(consumers, "PROGRESS_FRESH_S", 0.0)

    async def scenario():
        communicator, _, _ = await open_socket(f"/ws/runs/{run.pk}/", session_cookie)
        await communicator.send_json_to({"last_seq": 0})
        await ingest(run, [metrics(1, 0, **{"time/step_s": 1.0})])
        first = await received_until(communicator, 1)
        await ingest(run, [metrics(2, 1, **{"time/step_s": 1.0})])
        try:
            second = await received_until(communicator, 2)   # the read still waits
        finally:
            gate.set()
        await communicator.disconnect(timeout=10)
        return first[-1], second[-1]

    first, second = run_async(scenario)
    assert made == [run.pk, run.pk]
    assert (first["progress"]["step"], second["progress"]["step"]) == (1, 2)


def test_sockets_on_one_run_share_one_rendering_of_an_alert_change(
        run, channel_layer, session_cookie, monkeypatch):
    alert = Alert.objects.create(run=run, kind="ThroughputRegression", dedup_key="t",
                                 cause="slower", runbook="r", step=3)
    made = []
    real = RunConsumer.render_alerts
    monkeypatch.setattr(RunConsumer, "render_alerts",
                        lambda self, ids: made.append(ids) or real(self, ids))

    async def scenario():
        sockets = [(await open_socket(f"/ws/runs/{run.pk}/", session_cookie))[0]
                   for _ in range(3)]
        for communicator in sockets:
            await communicator.send_json_to({"last_seq": 0})
            await communicator.receive_json_from(timeout=20)   # the run's alerts, each
        await asyncio.to_thread(broadcast_alerts, run.pk, [alert.pk])   # as a worker does
        received = [await communicator.receive_json_from(timeout=20) for communicator in sockets]
        for communicator in sockets:
            await communicator.disconnect(timeout=10)
        return received

    received = run_async(scenario)
    assert received[0] == received[1] == received[2]
    assert f"alert-{alert.pk}" in received[0]["alerts"] and "run-health" in received[0]["swap"]
    assert made == [None, None, None, [alert.pk]]   # each socket's first, then one for all


def test_the_runs_list_socket_gets_each_runs_status_and_latest_metrics(
        run, channel_layer, session_cookie):
    async def scenario():
        communicator, connected, _ = await open_socket("/ws/runs/", session_cookie)
        assert connected
        await ingest(run, [status(1, "running"),
                           metrics(2, 7, **{"reward/mean": 0.5, "time/step_s": 1.25,
                                            "eval/reward_mean": 0.75})])
        message = await communicator.receive_json_from(timeout=20)
        await communicator.disconnect(timeout=10)
        return message

    message = run_async(scenario)

    assert message["run_id"] == run.pk
    assert (message["status"], message["step"]) == ("running", 8)   # steps 0..7 trained
    assert (message["reward_mean"], message["step_s"]) == (0.5, 1.25)
    assert message["held_out"] == 0.75
    assert f'id="run-{run.pk}-status"' in message["swap"][f"run-{run.pk}-status"]


def test_runs_list_sockets_share_one_rendering_of_a_runs_badge(
        run, channel_layer, session_cookie, monkeypatch):
    rendered = []
    real = consumers.render_to_string
    monkeypatch.setattr(consumers, "render_to_string",
                        lambda name, context: rendered.append(name) or real(name, context))
    consumers.status_badge.cache_clear()

    async def scenario():
        sockets = [(await open_socket("/ws/runs/", session_cookie))[0] for _ in range(2)]
        received = []
        for seq in (1, 2):
            await ingest(run, [metrics(seq, seq, **{"reward/mean": 0.5})])
            received += [await communicator.receive_json_from(timeout=20)
                         for communicator in sockets]
        for communicator in sockets:
            await communicator.disconnect(timeout=10)
        return received

    received = run_async(scenario)
    assert len({m["swap"][f"run-{run.pk}-status"] for m in received}) == 1
    assert rendered == ["jobs/_status_badge.html"]     # not per socket, not per batch


def test_an_update_carries_extend_traces_data_for_the_timeline():
    events = [span(1, 1, device="cpu:0", phase="rollout").to_dict(),
              span(2, 1, device="cpu:1", phase="learner").to_dict()]

    update = run_update(events, status=None)

    timeline = update["charts"]["timeline"]
    assert timeline["indices"] == [0, 2]  # rollout, learner among the phases
    assert timeline["y"] == [["cpu:0"], ["cpu:1"]]
    assert timeline["base"] == [[11000.0], [11000.0]] and timeline["x"] == [[500.0], [500.0]]
    assert update["last_seq"] == 2


def test_a_pause_applied_swaps_the_badge_to_paused_and_a_resume_back(
        run, channel_layer, session_cookie):
    pause = RunControl.objects.create(run=run, kind="pause")
    resume = RunControl.objects.create(run=run, kind="resume")

    def applied(seq, control):
        return ControlAppliedEvent(seq=seq, ts=1000.0 + seq, control_id=control.pk,
                                   kind=control.kind, step=2, requested_by="olga",
                                   message=f"{control.kind} (by olga)")

    async def scenario():
        communicator, _, _ = await open_socket(f"/ws/runs/{run.pk}/", session_cookie)
        await communicator.send_json_to({"last_seq": 0})
        await ingest(run, [applied(1, pause)])
        paused = await received_until(communicator, 1)
        await ingest(run, [applied(2, resume)])
        resumed = await received_until(communicator, 2)
        await communicator.disconnect(timeout=10)
        return paused[-1], resumed[-1]

    paused, resumed = run_async(scenario)

    assert ">paused</span>" in paused["swap"]["run-status"]
    assert paused["marks"] == [{"step": 2, "label": "pause"}]
    assert ">running</span>" in resumed["swap"]["run-status"]


def test_a_run_that_ends_stops_the_header_clock_and_says_why(
        make_run, channel_layer, session_cookie):
    run = make_run(started_at=timezone.now())
    do_ingest_events(run, [metrics(1, 0, **{"time/step_s": 2.0}),
                           metrics(2, 1, **{"time/step_s": 2.0})])

    async def scenario():
        communicator, _, _ = await open_socket(f"/ws/runs/{run.pk}/", session_cookie)
        await communicator.send_json_to({"last_seq": 0})
        live = await received_until(communicator, 2)
        await ingest(run, [status(3, "succeeded", "max_seconds=300 reached after step 2 of 30")])
        ended = await received_until(communicator, 3)
        await communicator.disconnect(timeout=10)
        return live[-1], ended[-1]

    live, ended = run_async(scenario)

    # Steps trained, as the checkpoints count them (the engine's metrics count from 0).
    assert live["progress"]["step"] == 2 and live["progress"]["eta_s"] > 0
    assert live["progress"]["finished_at"] is None and not live["progress"]["terminal"]
    assert ended["progress"]["terminal"] and ended["progress"]["eta_s"] is None
    assert ended["progress"]["finished_at"] >= ended["progress"]["started_at"]
    assert "max_seconds=300 reached" in ended["swap"]["run-status-reason"]


def test_a_launched_commands_output_is_appended_to_the_log_panel_outside_the_stream(
        run, channel_layer, session_cookie):
    from jobs.runs.job_logs import do_store_job_log

    async def scenario():
        communicator, connected, _ = await open_socket(f"/ws/runs/{run.pk}/", session_cookie)
        assert connected
        await communicator.send_json_to({"last_seq": 0})
        await database_sync_to_async(do_store_job_log)(run, "epoch 1 loss 0.3\n", False)
        message = await communicator.receive_json_from(timeout=20)
        await communicator.disconnect()
        return message

    message = run_async(scenario)

    assert set(message) == {"logs"}   # no seq: the page's stream position stays
    assert "epoch 1 loss 0.3" in message["logs"]["run-logs"]
    assert 'data-seq="-1"' in message["logs"]["run-logs"]


def test_a_tab_closing_while_redis_times_out_leaves_no_traceback(
        run, channel_layer, session_cookie, monkeypatch, caplog):
    from redis.exceptions import TimeoutError as RedisTimeout

    async def slow_redis(*args):
        raise RedisTimeout("Timeout reading from socket")

    async def scenario():
        communicator, _, _ = await open_socket(f"/ws/runs/{run.pk}/", session_cookie)
        monkeypatch.setattr(channel_layer, "group_discard", slow_redis)
        await communicator.disconnect(timeout=10)

    run_async(scenario)

    assert "without Redis's answer" in caplog.text and "Traceback" not in caplog.text


def test_a_live_message_moves_the_last_reads_clock_on_to_its_steps_and_its_time():
    """Between progress reads a message's header comes from the last read, moved on: the
    steps its metrics trained, the ETA for the steps left at the read's seconds a step,
    and without a new step the read's ETA counted down by the time since."""
    from jobs.queries.run_page import clock_after

    read = {"now": 100.0, "started_at": 90.0, "finished_at": None, "eta_s": 20.0,
            "step": 10, "steps": 30, "status": "running", "terminal": False}
    stepped = clock_after(read, [metrics(5, 14, **{"time/step_s": 1.0}).to_dict()], False,
                          104.0)
    assert (stepped["step"], stepped["eta_s"], stepped["now"]) == (15, 15.0, 104.0)
    idle = clock_after(read, [log(5).to_dict()], False, 103.0)
    assert (idle["step"], idle["eta_s"], idle["now"]) == (10, 17.0, 103.0)
    # read before the first step time: the ETA from the events' own
    first = clock_after({**read, "eta_s": None, "step": 0}, [
        metrics(5, 0, **{"time/step_s": 0.5}).to_dict(),
        metrics(6, 1, **{"time/step_s": 1.5}).to_dict()], False, 101.0)
    assert (first["step"], first["eta_s"]) == (2, 28.0)
