"""Chaos drills (issue 19): a run launched the operator's way (the queue, a Celery
submit_run, a Ray job on a real local head, ingest over HTTP) while a part of the control
plane fails under it. Each drill prints its figure for the closing note.

    RayHead (tests/ray_head.py, its own session) <---- Ray job: python -m engine.ray_job
                                                        (one head; each drill's control
                                                        plane its own RLPLANE_RAY_JOB_PREFIX,
                                                        as its run ids start at 1 again)
    ControlPlane: redis-server, celery worker, celery beat, uvicorn, one SQLite file,
                  each in its own session (setsid), killed by process group

    driver      SIGKILL the run's driver past its first checkpoint: sync_runs submits it
                again (run.max_restarts), it resumes from the checkpoint, serves each
                prompt once, stores every event once, and no alert but the restart's
                own (DriverRestarted, cleared once past the step of the kill) fires
    worker      SIGKILL the Celery worker as it takes the run's submit_run, start another:
                the beat's sync_runs queues the submit again (resubmit_stuck_runs) and
                the run is submitted once and finishes

The control plane is started piece by piece rather than as controlplane.stack, so that
each drill kills and restarts the piece it names by hand. The drills of the real stack,
whose supervisor restarts a dead child itself (Redis, the worker, uvicorn, all of them
at once; the whole stack at a checkpoint), are tests/e2e/test_stack_drills.py.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest

from controlplane import processes as proc

from ..ray_head import RayHead
from .local_processes import (
    STEADY_RUN,
    celery_worker_argv,
    drill_env,
    healthy,
    kill_group,
    manage,
    query,
    redis_argv,
    spawn,
    stored_seqs,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

# sync_runs queues an unsubmitted run's submit again after this (120 s by default): long
# enough that a live worker's submit (a few seconds) is not twinned, short enough that the
# worker drill does not idle two minutes for it.
RESUBMIT_AFTER_S = 20

# 60 steps (~1 min on 2 busy cores): time to be hurt mid-run and to go on after it.
CONFIG = {**STEADY_RUN, "steps": 60, "telemetry": {"eval_samples": 1}}
# The driver drill: a checkpoint early, its resume and the steps after it.
RESTART_CONFIG = {**CONFIG, "steps": 30, "checkpoint": {"every_steps": 10}}
# The worker drill hurts the run before it starts: any run that finishes shows it went on.
SHORT_CONFIG = {**CONFIG, "steps": 10}

LAUNCH = """
import json, os
from jobs.runs.actions import do_launch_run
print(do_launch_run(None, "drill", json.loads(os.environ["RUN_CONFIG"])).pk)
"""


class ControlPlane:
    """redis, celery worker + beat, uvicorn over one SQLite file; parts killed and
    started again by name."""

    def __init__(self, root: Path, head: RayHead, job_prefix: str):
        self.root, self.logs, self.head = root, root / "logs", head
        self.logs.mkdir()
        self.db, self.runs_dir = root / "db.sqlite3", root / "runs"
        self.redis_port, self.http_port = proc.free_port(), proc.free_port()
        self.url = f"http://127.0.0.1:{self.http_port}"
        self.env = drill_env(
            self.db, self.redis_port, RLPLANE_URL=self.url, RLPLANE_RUNS_DIR=str(self.runs_dir),
            RAY_DASHBOARD_ADDRESS=head.dashboard, RAY_AUTH_TOKEN_PATH=str(head.token_path),
            RLPLANE_CACHE=os.environ.get("RLPLANE_CACHE", str(root / "cache")),
            RLPLANE_RESUBMIT_AFTER_S=str(RESUBMIT_AFTER_S), RLPLANE_RAY_JOB_PREFIX=job_prefix)
        self.job_prefix = job_prefix
        self.env.pop("RAY_AUTH_TOKEN", None)
        self.children: dict[str, object] = {}
        self.argv = {
            "redis": redis_argv(self.redis_port, root),
            "worker": celery_worker_argv(f"drill-{self.http_port}"),
            "beat": [sys.executable, "-m", "celery", "-A", "controlplane", "beat",
                     "--loglevel=INFO", f"--schedule={root / 'celerybeat-schedule'}"],
            "web": [sys.executable, "-m", "uvicorn", "controlplane.asgi:application",
                    "--host", "127.0.0.1", "--port", str(self.http_port)],
        }

    def start(self, *names: str) -> float:
        """Start the parts (all by default) and wait until they answer; seconds taken."""
        began = time.monotonic()
        names = names or ("redis", "worker", "beat", "web")
        worker_log = self.logs / "worker.log"
        readies = worker_log.read_text().count(" ready.") if worker_log.exists() else 0
        for name in names:
            self.children[name] = spawn(self.argv[name], self.env, self.logs / f"{name}.log")
        if "worker" in names:
            wait_for("the celery worker ready",
                     lambda: worker_log.read_text().count(" ready.") > readies, 120, worker_log)
        if "web" in names:
            wait_for("uvicorn answering", lambda: healthy(self.url), 60, self.logs / "web.log")
        return time.monotonic() - began

    def kill(self, *names: str) -> None:
        for name in names or tuple(self.children):
            kill_group(self.children.pop(name, None))

    def launch(self, config: dict = CONFIG) -> int:
        return int(manage({**self.env, "RUN_CONFIG": json.dumps(config)}, "shell", "-c",
                          LAUNCH).split()[-1])

    def status(self, run_id: int) -> str:
        return query(self.db, "SELECT status FROM jobs_run WHERE id = ?", run_id)[0][0]

    def emitted(self, run_id: int) -> list[dict]:
        path = self.runs_dir / f"run-{run_id}" / "events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() \
            else []

    def driver(self, run_id: int) -> psutil.Process | None:
        run_dir = str(self.runs_dir / f"run-{run_id}")     # this drill's, on the shared head
        for p in psutil.process_iter(["cmdline"]):
            cmd = p.info["cmdline"] or []
            if "engine.ray_job" in cmd and run_dir in cmd:
                return p
        return None

    def wait_running(self, run_id: int, events: int = 20) -> None:
        wait_for(f"{events} events of run {run_id} stored",
                 lambda: len(stored_seqs(self.db, run_id)) >= events, 240,
                 self.logs / "worker.log")
        assert self.driver(run_id) is not None, "the run ended before the drill"

    def assert_every_event_stored_once(self, run_id: int) -> int:
        emitted = self.emitted(run_id)
        n = len(emitted)
        seqs = stored_seqs(self.db, run_id)
        assert seqs == list(range(1, n + 1)), (
            f"stored {len(seqs)} events of {n} emitted; missing "
            f"{sorted(set(range(1, n + 1)) - set(seqs))[:10]}")
        stored = dict(query(self.db, "SELECT seq, type FROM jobs_runevent WHERE run_id = ?",
                            run_id))
        assert all(stored[e["seq"]] == e["type"] for e in emitted)
        return n


DRILLS = itertools.count()


@pytest.fixture(scope="module")
def ray_head():
    """One Ray head for the drills (starting one took ~10 s a drill); each drill's jobs
    are stopped after it."""
    head = RayHead()
    try:
        head.wait_ready()
        yield head
    finally:
        head.stop()


@pytest.fixture
def plane(ray_head, tmp_path_factory):
    """A control plane of the drill's own on the shared head: run ids start at 1 in each
    drill's database, so its Ray job ids carry a prefix of its own (RLPLANE_RAY_JOB_PREFIX,
    what two control planes on one cluster set)."""
    prefix = f"drill{next(DRILLS)}-"
    cp = ControlPlane(tmp_path_factory.mktemp("cp"), ray_head, prefix)
    try:
        cp.start("redis")
        manage(cp.env, "migrate", "--noinput")
        cp.start("worker", "beat", "web")
        yield cp
    finally:
        cp.kill()
        client = ray_head.client()
        for job in client.list_jobs():
            if job.status in ("PENDING", "RUNNING"):
                client.stop_job(job.submission_id)


def wait_status(cp: ControlPlane, run_id: int, status: str, timeout_s: float = 300) -> float:
    began = time.monotonic()
    wait_for(f"run {run_id} {status}", lambda: cp.status(run_id) == status, timeout_s,
             cp.logs / "worker.log")
    return time.monotonic() - began


@pytest.mark.timeout(600)
def test_a_sigkilled_driver_resumes_from_its_checkpoint_serving_each_prompt_once(plane):
    run_id = plane.launch(RESTART_CONFIG)
    wait_for("the first checkpoint stored", lambda: query(
        plane.db, "SELECT count(*) FROM jobs_checkpoint WHERE run_id = ?", run_id)[0][0], 240,
        plane.logs / "worker.log")
    checkpointed = max(e["step"] for e in plane.emitted(run_id) if e["type"] == "metrics.append")
    wait_for("steps past the checkpoint", lambda: max(
        e["step"] for e in plane.emitted(run_id) if e["type"] == "metrics.append"
    ) >= checkpointed + 2, 120)
    plane.driver(run_id).send_signal(signal.SIGKILL)
    killed = time.monotonic()
    wait_for("the driver submitted again", lambda: query(
        plane.db, "SELECT restarts FROM jobs_run WHERE id = ?", run_id)[0][0] not in ("[]",),
        120, plane.logs / "beat.log")
    restart_s = time.monotonic() - killed
    wait_status(plane, run_id, "succeeded")

    [(restarts, reason)] = query(plane.db, "SELECT restarts, status_reason FROM jobs_run "
                                           "WHERE id = ?", run_id)
    [restart] = json.loads(restarts)
    assert "killed (SIGKILL)" in restart["cause"], restart
    n = plane.assert_every_event_stored_once(run_id)      # the dead driver's spool too
    resumed = [e["message"] for e in plane.emitted(run_id) if e["type"] == "log"
               and e["message"].startswith("resumed from step_")]
    assert len(resumed) == 1, resumed
    # The ledger across the restart (its data position is in the checkpoint): every
    # prompt of every step served once, none skipped or served again.
    last = {name: value for name, value in query(
        plane.db, "SELECT name, value FROM jobs_metricpoint WHERE run_id = ? AND step = ? "
                  "AND name LIKE 'data/%'", run_id, RESTART_CONFIG["steps"] - 1)}
    prompts = RESTART_CONFIG["steps"] * RESTART_CONFIG["rollout"]["prompts_per_step"]
    assert last["data/served"] == last["data/trained"] + last["data/dropped"] == prompts, last
    assert last["data/skipped"] == last["data/repeated"] == 0, last
    # The resume restored the weight version: nothing fired (VersionRegression,
    # StalenessOverBound, DataIntegrity, RunLost, StoppedReporting ...) but the restart's
    # own notice, cleared once the resumed driver trained past the step of the kill, and
    # StuckReward, the recipe's own (a random-init model, 30 steps: no learning needed).
    # The rules run on the Celery worker after each batch commits (jobs/alerts/debounce.py):
    # the one that reads the last batch may come after the status the test waited for.
    def alerts():
        return query(plane.db, "SELECT kind, state, resolved_reason FROM jobs_alert WHERE "
                               "run_id = ? AND kind != 'StuckReward'", run_id)

    wait_for("the restart's notice resolved", lambda: [(k, s) for k, s, _ in alerts()] == [
        ("DriverRestarted", "resolved")], 60, plane.logs / "worker.log")
    [(_, _, resolved_reason)] = alerts()
    print(f"\ndriver SIGKILL at step >= {checkpointed + 2}: submitted again after "
          f"{restart_s:.1f}s, {resumed[0]}; succeeded with {n} events, 0 lost, 0 twice; "
          f"{prompts} prompts served once, 0 skipped, 0 repeated; DriverRestarted "
          f"resolved ({resolved_reason}), no other alert")


@pytest.mark.timeout(900)
def test_killing_the_worker_mid_submit_still_submits_the_run_once(plane):
    log = plane.logs / "worker.log"
    received = log.read_text().count("jobs.runs.submit.submit_run")
    run_id = plane.launch(SHORT_CONFIG)
    wait_for("the worker taking submit_run",
             lambda: log.read_text().count("jobs.runs.submit.submit_run") > received, 120, log)
    plane.kill("worker")
    killed = time.monotonic()
    sid = f"{plane.job_prefix}{run_id}"
    taken = log.read_text().count("jobs.runs.submit.submit_run")
    plane.start("worker")
    wait_status(plane, run_id, "running", 400)
    running_s = time.monotonic() - killed
    wait_status(plane, run_id, "succeeded")

    assert [job.submission_id for job in plane.head.client().list_jobs()].count(sid) == 1
    starts = [e for e in plane.emitted(run_id) if e["type"] == "run.status"
              and e["status"] == "starting"]
    assert len(starts) == 1, "the driver ran more than once"
    n = plane.assert_every_event_stored_once(run_id)
    # Either the dead worker's submit request had reached Ray, or sync_runs queued the
    # submit again (after RESUBMIT_AFTER_S) and the new worker made it.
    resubmitted = log.read_text().count("jobs.runs.submit.submit_run") > taken
    print(f"\nworker killed mid-submit: running {running_s:.0f}s after the kill, "
          f"{'resubmitted by sync_runs' if resubmitted else 'its submit had reached Ray'} "
          f"(resubmission after {RESUBMIT_AFTER_S}s); one Ray job, {n} events, 0 lost, 0 twice")
