"""rlplane.track against the real control plane (pytest-django's live_server), reached
through a small stdlib proxy the tests switch to answering 500, take down and bring back
on the same port (tests/ingest_gate.py)."""

import json
import logging
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from django.utils import timezone

from engine import metrics as M
from jobs.models import InspectedSample, MetricPoint, PhaseSpan, Run, RunEvent, RunStatus
from rlplane import track
from tests.ingest_gate import Gate

ROOT = Path(__file__).resolve().parents[1]
REWARD = "reward"      # a framework's own name: the client passes any name through


@pytest.fixture
def gate(live_server):
    gate = Gate(live_server.url).up()
    yield gate
    gate.down()


@pytest.fixture
def run_and_token(transactional_db):
    run = Run.objects.create(name="a script", config={}, status=RunStatus.RUNNING)
    return run, run.issue_ingest_token()


@pytest.fixture
def start(run_and_token, tmp_path):
    """init() with the test's run and spool, and intervals short enough for a test."""
    started = []

    def start(url, token=None):
        run, good_token = run_and_token
        client = track.init(url, token or good_token, run.pk, spool_dir=tmp_path / "spool",
                            flush_interval=0.05, controls_interval=60, timeout=5)
        started.append(client)
        return client

    yield start
    for client in started:
        client.finish(timeout=1)


def stored_steps(run: Run, name: str = REWARD) -> list[int]:
    return list(MetricPoint.objects.filter(run=run, name=name).order_by("step")
                .values_list("step", flat=True))


def stored_seqs(run: Run) -> list[int]:
    return list(RunEvent.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))


def test_metrics_spans_samples_logs_and_finish_land_in_the_control_plane(
        live_server, run_and_token, start):
    run, _ = run_and_token
    client = start(live_server.url)
    for step in range(3):
        with client.span("rollout", device="gpu0", step=step):
            pass
        client.log(step, {REWARD: step / 10, "loss": 1.0 - step})
    client.span("learner", device="gpu0", step=2, start=1_700_000_000.0, end=1_700_000_002.5)
    client.samples(2, [{"prompt": "2+2=", "completion": "4", "reward": 1,
                        "tokens": ["4"], "judge": "not a RolloutSample field"}])
    client.log_text("epoch 1 done", level="warning")

    assert client.finish(timeout=30)

    assert stored_steps(run) == [0, 1, 2]
    assert stored_seqs(run) == list(range(1, 12))   # running, 3 x (span, metrics), ...
    spans = PhaseSpan.objects.filter(run=run)
    assert sorted(s.phase for s in spans) == ["learner", "rollout", "rollout", "rollout"]
    assert spans.get(phase="learner").end - spans.get(phase="learner").start == 2.5
    sample = InspectedSample.objects.get(run=run, step=2)
    assert (sample.prompt, sample.completion, sample.reward) == ("2+2=", "4", 1.0)
    assert sample.tokens == {"text": ["4"], "behaviour": [None], "learner": [None]}
    log = RunEvent.objects.get(run=run, type="log").payload
    assert (log["level"], log["message"]) == ("warning", "epoch 1 done")
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED


def test_nothing_is_lost_and_nothing_raised_across_500s_and_a_control_plane_restart(
        gate, run_and_token, start):
    run, _ = run_and_token
    client = start(gate.base_url)
    client.log(0, {REWARD: 0.0})
    assert client.flush()

    gate.failing = True                     # the control plane answers 500
    for step in (1, 2, 3):
        client.log(step, {REWARD: step / 10})
    assert not client.flush()               # tried, and kept in the spool
    gate.down()                             # and then it is gone
    for step in (4, 5, 6):
        client.log(step, {REWARD: step / 10})
    assert not client.flush()
    spooled = [json.loads(line)["seq"] for line in client.spool_path.read_text().splitlines()]
    assert spooled == list(range(3, 9))

    gate.failing = False
    gate.up()                               # back, on the same port
    assert client.finish(timeout=30)

    assert stored_steps(run) == list(range(7))          # every step stored once
    assert stored_seqs(run) == list(range(1, 10))
    arrivals = gate.seqs_in_arrival_order()
    assert arrivals == sorted(arrivals)                 # replayed in order
    assert not client.spool_path.exists()
    assert client.errors == 0 and client.set_aside == 0


def test_a_new_process_numbers_its_events_on_from_what_the_run_has(
        gate, run_and_token, start, tmp_path):
    """A script restarted while the control plane is away spools under seqs past those
    stored (its run-<id>.seq); one started while it is there asks it."""
    run, _ = run_and_token
    first = start(gate.base_url)
    for step in range(3):
        first.log(step, {REWARD: 0.5})
    assert first.finish(timeout=30)

    gate.down()
    crashed = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(f"""
            import os
            from rlplane import track
            client = track.init({gate.base_url!r}, {run_and_token[1]!r}, {run.pk},
                                spool_dir={str(tmp_path / "spool")!r}, timeout=5)
            for step in (3, 4):
                client.log(step, {{{REWARD!r}: 0.5}})
            client.flush(5)
            os._exit(0)      # dies without finish(): its events are in the spool
        """)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert crashed.returncode == 0, crashed.stderr
    gate.up()

    again = start(gate.base_url)                 # same spool: replays it, then goes on
    again.log(5, {REWARD: 0.5})
    assert again.finish(timeout=30)
    elsewhere = track.init(gate.base_url, run_and_token[1], run.pk, spool_dir=tmp_path / "other",
                           flush_interval=0.05, controls_interval=60)
    elsewhere.log(6, {REWARD: 0.5})         # no spool here: the server says where seqs are
    assert elsewhere.finish(timeout=30)

    assert stored_steps(run) == list(range(7))
    seqs = stored_seqs(run)
    assert seqs == sorted(set(seqs)) and len(seqs) == 14  # 4 running + 7 metrics + 3 ends
    assert seqs[-1] - seqs[0] < 2 * track.SEQ_BLOCK


def test_nan_and_inf_are_dropped_with_a_count_and_logged_once(
        live_server, run_and_token, start, caplog):
    run, _ = run_and_token
    client = start(live_server.url)
    client.log(0, {REWARD: 1.0, "loss": math.nan, "kl": math.inf})
    client.log(1, {REWARD: 1.0, "loss": -math.inf, "note": "not a number"})
    client.samples(1, [{"prompt": "p", "completion": "c", "reward": math.nan}])
    assert client.finish(timeout=30)

    assert client.dropped_nonfinite == 4 and client.errors == 1
    assert stored_steps(run) == [0, 1]
    assert not MetricPoint.objects.filter(run=run, name="loss").exists()
    assert dict(MetricPoint.objects.filter(run=run, name=M.TRACK_DROPPED_NONFINITE)
                .values_list("step", "value")) == {0: 2.0, 1: 3.0}
    assert not InspectedSample.objects.filter(run=run).exists()
    assert caplog.text.count("NaN and inf values are dropped") == 1


def test_a_wrong_token_is_logged_once_and_never_raises(
        live_server, run_and_token, start, caplog):
    run, _ = run_and_token
    caplog.set_level(logging.WARNING)
    client = start(live_server.url, token="not-the-token")
    for step in range(3):
        client.log(step, {REWARD: 1.0})
        assert client.flush()               # refused: set aside, not waiting for a retry
    client.poll_controls()
    assert client.finish(timeout=30)        # nothing left to deliver: all set aside

    assert not RunEvent.objects.filter(run=run).exists()
    assert client.set_aside == 5            # running, 3 metrics, succeeded
    refusals = [r for r in caplog.records if "not run" in r.getMessage()]
    assert [r.name for r in refusals] == ["rlplane.track", "engine.telemetry.http_sink"]
    assert client.spool_path.with_name(client.spool_path.name + ".rejected").exists()


def test_stop_requested_follows_the_control_plane(live_server, run_and_token, start):
    run, _ = run_and_token
    client = start(live_server.url)
    assert not client.poll_controls()
    run.stop_requested_at = timezone.now()
    run.save(update_fields=["stop_requested_at"])
    assert client.poll_controls() and client.stop_requested


def test_an_exception_in_its_with_block_reports_the_run_failed_and_reaches_the_caller(
        live_server, run_and_token, tmp_path):
    run, token = run_and_token
    with pytest.raises(ZeroDivisionError):
        with track.init(live_server.url, token, run.pk, spool_dir=tmp_path,
                        flush_interval=0.05, controls_interval=60) as client:
            client.log(0, {REWARD: 1.0})
            raise ZeroDivisionError("the loss divided by zero")
    [status] = RunEvent.objects.filter(run=run, type="run.status", payload__status="failed")
    assert "ZeroDivisionError" in status.payload["message"]
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED


def test_a_script_that_ends_on_an_exception_without_finish_still_delivers_and_fails_its_run(
        live_server, run_and_token, tmp_path):
    run, token = run_and_token
    script = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(f"""
            from rlplane import track
            client = track.init({live_server.url!r}, {token!r}, {run.pk},
                                spool_dir={str(tmp_path)!r}, flush_interval=60)
            for step in (0, 1):
                client.log(step, {{{REWARD!r}: 0.5}})
            raise MemoryError("the learner ran out of memory")
        """)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert script.returncode == 1 and "MemoryError" in script.stderr

    assert stored_steps(run) == [0, 1]       # flush_interval=60: only exit delivered them
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert "the learner ran out of memory" in run.status_reason


def test_init_names_the_environment_variable_it_lacks(monkeypatch):
    monkeypatch.setenv("RLPLANE_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("RLPLANE_RUN_ID", "7")
    monkeypatch.delenv("RLPLANE_TOKEN", raising=False)
    with pytest.raises(track.TrackConfigError, match="RLPLANE_TOKEN"):
        track.init()
    monkeypatch.setenv("RLPLANE_TOKEN", "t")
    monkeypatch.setenv("RLPLANE_RUN_ID", "seven")
    with pytest.raises(track.TrackConfigError, match="RLPLANE_RUN_ID"):
        track.init()


def test_importing_the_client_pulls_no_torch_django_ray_or_transformers():
    heavy = ("torch", "django", "ray", "transformers")
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, rlplane.track; "
         f"print([m for m in {heavy!r} if m in sys.modules])"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    assert loaded.stdout.strip() == "[]"


def test_verl_files_tailed_by_watch_files_land_under_rlplane_names(gate, transactional_db,
                                                                    tmp_path):
    """veRL's file logger and rollout dump (written by tests/test_tail.py's copies of
    veRL's writers) -> watch_files -> rlplane.track -> ingest of an external veRL run:
    stored under rlplane's names, the rollouts in the inspector."""
    from rlplane.tail import watch_files
    from tests.test_tail import VerlFileLogger, verl_dump_generations

    run = Run.objects.create(name="verl", config={"framework": "verl", "name": "verl"},
                             status=RunStatus.RUNNING)
    client = track.init(gate.base_url, run.issue_ingest_token(), run.pk,
                        spool_dir=tmp_path / "spool", flush_interval=0.05,
                        controls_interval=60, timeout=5)
    logger = VerlFileLogger(tmp_path / "metrics.jsonl")
    for step in (1, 2):
        logger.log({"timing_s/gen": 40.0 + step, "critic/score/mean": step / 10}, step=step)
    verl_dump_generations(2, ["1+1="], ["2"], ["2"], [1.0], {}, tmp_path / "rollouts")
    watch_files(client, [tmp_path / "metrics.jsonl", tmp_path / "rollouts"], "verl",
                stop=lambda: True)
    client.finish(timeout=5)

    assert stored_steps(run, M.TIME_ROLLOUT_S) == [1, 2]
    assert stored_steps(run, M.REWARD_MEAN) == [1, 2]
    assert list(InspectedSample.objects.filter(run=run).values_list("completion", "reward")) \
        == [("2", 1.0)]
