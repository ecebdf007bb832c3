"""Drills on the real embedded stack (issue 30): `python -m controlplane.stack start
--no-demo` in its own session, a run launched the operator's way (log in with the
credentials the stack wrote, an API token from the settings page, POST /api/v1/runs),
then parts of it SIGKILLed mid-run. Each drill prints its figures for the closing note.

    supervisor (setsid) --+-- ray head ----------- Ray job: python -m engine.ray_job
      pid file stack.json +-- redis-server           (the run's driver, its own session)
      (children, restarts)+-- celery worker, beat
                          +-- uvicorn

    children   SIGKILL Redis, then the Celery worker, then uvicorn, then all of them and
               the beat at once, mid-run: the supervisor starts each again (its pid file
               and the cluster page say so), the beat and worker work on each new Redis,
               the run goes on until the operator stops it, and every event its driver
               emitted is stored once
    whole      SIGKILL the supervisor and every session its pid file names (the Ray head
               with them; the driver, in a session of its own, may train on) right after
               the driver finished a checkpoint; start the stack again on the same state
               dir (it kills the headless driver): the run is lost with the cause, every
               checkpoint on disk is listed (reconcile_runs read what never arrived),
               every event on disk is stored once, and a fork from the latest checkpoint
               runs to its end

Both drills share one stack (the second restarts it anyway): a stack start costs 10-17 s.
The chaos drills (test_chaos_drills.py) start the control plane piece by piece instead,
on a Ray head of their own.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from controlplane import processes as proc
from controlplane.processes import StackRecord
from controlplane.stack import redis_pings

from .local_processes import STEADY_RUN, healthy, query, spawn, stored_seqs, wait_for
from .test_chaos_drills import ControlPlane
from .test_operate_remotely import Browser, api

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

# A restarted child is started again this long after its exit (1 s by default, doubled per
# restart): short, so that the drill measures the child's own start.
RESTART_DELAY_S = "0.2"
# Runs until the drill stops it: 60 steps took 13 s on an idle machine, less than the
# four outages (each waits for events to flow again), and ~60 s on busy cores.
CONFIG = {**STEADY_RUN, "steps": 5000, "telemetry": {"eval_samples": 1}}
# A checkpoint early on: the whole stack dies right after it. A driver may outlive its head
# and train on until the next start kills it: every checkpoint is kept, to be listed.
CHECKPOINTED = {**CONFIG, "checkpoint": {"every_steps": 5, "keep_last": 100}}
FORK_STEPS = 3       # the fork trains this many steps past its checkpoint


class Stack:
    """The stack's supervisor in its own session, on a state dir, database and runs dir
    of the test's own; its children found from its pid file."""

    def __init__(self, root: Path):
        self.root, self.state = root, root / "state"
        self.db, self.runs_dir = root / "db.sqlite3", root / "runs"
        self.log = root / "supervisor.log"
        self.env = {
            **os.environ, "DATABASE_URL": f"sqlite:///{self.db}",
            "RLPLANE_RUNS_DIR": str(self.runs_dir),
            "RLPLANE_CACHE": os.environ.get("RLPLANE_CACHE", str(root / "cache")),
            "RLPLANE_RESTART_DELAY_S": RESTART_DELAY_S, "RLPLANE_RAY_CPUS": "1",
            "RLPLANE_RAY_OBJECT_STORE_MB": "256"}
        self.env.pop(proc.STACK_MARKER, None)
        self.supervisor: subprocess.Popen | None = None
        self.browser: Browser | None = None
        self.token = ""

    # the chaos drills' checks, on this stack's database and runs dir
    status = ControlPlane.status
    emitted = ControlPlane.emitted
    assert_every_event_stored_once = ControlPlane.assert_every_event_stored_once

    @property
    def pid_file(self) -> Path:
        return self.state / "stack" / "stack.json"

    def record(self) -> StackRecord:
        return proc.read_pid_file(self.pid_file)

    @property
    def url(self) -> str:
        return self.record().urls["web"].rstrip("/")

    def start(self) -> float:
        """Start the stack (stopping what a previous one left) until its pid file says
        ready; seconds taken."""
        began = time.monotonic()
        self.supervisor = spawn(
            [sys.executable, "-m", "controlplane.stack", "start", "--no-demo",
             "--state-dir", str(self.state), "--port", str(proc.free_port())],
            self.env, self.log)

        def ready() -> bool:
            assert self.supervisor.poll() is None, (
                f"the stack exited ({self.supervisor.returncode}):\n{proc.log_tail(self.log)}")
            record = self.record()
            return bool(record and record.ready and record.supervisor_pid == self.supervisor.pid)

        wait_for("the stack ready", ready, 240, self.log)
        self.log_in()
        return time.monotonic() - began

    def log_in(self) -> None:
        """The operator, with the password the stack generated, and an API token."""
        credentials = json.loads((self.state / "operator.json").read_text())
        self.browser = Browser(self.url)
        self.browser.post_form("/login", {k: credentials[k] for k in ("username", "password")})
        if not self.token:
            page = self.browser.post_form("/settings/tokens", {"name": "drills"})
            self.token = html.unescape(
                re.search(r'<code id="token-value">([^<]+)</code>', page).group(1))

    def api(self, path: str, body: dict | None = None):
        return api(self.url, self.token, path, body)

    def launch(self, config: dict) -> int:
        return self.api("/runs", {"config": config})["id"]

    def child_pid(self, name: str) -> int:
        return next(c.pid for c in self.record().children if c.name == name)

    def kill_child(self, name: str) -> int:
        """SIGKILL the child's session (its process group: a Celery pool too); its pid."""
        pid = self.child_pid(name)
        os.killpg(pid, signal.SIGKILL)
        return pid

    def restarted(self, name: str, old_pid: int) -> dict | None:
        """The supervisor's note of restarting the child ``old_pid`` was, once its new
        process is alive."""
        note = next((n for n in self.record().restarts
                     if n["child"] == name and n["pid"] == old_pid), None)
        return note if note and proc.is_alive(note["new_pid"]) else None

    def child_log(self, name: str) -> Path:
        return self.state / "stack" / "logs" / f"{name}.log"

    def died_on_its_own(self, notes: list[dict]) -> str:
        """What the supervisor noted of each restart no drill caused, and the lines the
        child logged before it died (its log until the restart's marker)."""
        parts = []
        for note in notes:
            text = self.child_log(note["child"]).read_text(errors="replace")
            before = text.split(f"--- rlplane: {note['child']} (pid {note['pid']})")[0]
            parts.append(f"{note['child']} (pid {note['pid']}) {note['exit']} at "
                         f"{note['died_at']}, not killed by the drill; its last lines:\n"
                         + "\n".join(before.splitlines()[-40:]))
        return "\n\n".join(parts)

    def kill_everything(self) -> None:
        """SIGKILL the supervisor's session and every child session its pid file names:
        no one is left to clean up."""
        record = self.record()
        for pid in [record.supervisor_pid, *(c.pid for c in record.children)]:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.supervisor.wait(timeout=10)

    def stop(self) -> set[int]:
        """SIGTERM the supervisor (it stops its children), then sweep what carries its
        marker; the pids that were left for the sweep."""
        if self.supervisor is not None and self.supervisor.poll() is None:
            self.supervisor.send_signal(signal.SIGTERM)
            try:
                self.supervisor.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.supervisor.pid, signal.SIGKILL)
                self.supervisor.wait()
        marker = str(self.state / "stack")
        left = proc.marked_processes(marker)
        proc.terminate(left, grace_s=2)
        return left


@pytest.fixture(scope="module")
def stack():
    # A short path: Ray's unix sockets live under the state dir (107-byte limit).
    cp = Stack(Path(tempfile.mkdtemp(prefix="rlsd", dir="/tmp")))
    try:
        print(f"\nstack started in {cp.start():.1f}s")
        yield cp
    finally:
        left = cp.stop()
        shutil.rmtree(cp.root, ignore_errors=True)
        assert left == set(), f"the stack left processes behind: {sorted(left)}"


def wait_events(cp: Stack, run_id: int, more_than: int, what: str) -> int:
    """Until the database holds more than ``more_than`` events of the run; how many."""
    wait_for(f"{what}: more than {more_than} events of run {run_id} stored",
             lambda: len(stored_seqs(cp.db, run_id)) > more_than, 180, cp.log)
    assert cp.status(run_id) == "running", f"run {run_id} ended before the drill was done"
    return len(stored_seqs(cp.db, run_id))


def wait_status(cp: Stack, run_id: int, status: str, timeout_s: float = 300) -> float:
    began = time.monotonic()
    wait_for(f"run {run_id} {status}", lambda: cp.status(run_id) == status, timeout_s, cp.log)
    return time.monotonic() - began


def answering(cp: Stack, name: str):
    """How the child ``name`` is back at work after a restart (beyond being alive)."""
    if name == "redis":
        password = (cp.state / "stack" / "redis" / "redis.conf").read_text().split()[1]
        port = int(cp.record().urls["redis"].rsplit(":", 1)[1].split("/")[0])
        return lambda: redis_pings(port, password)
    if name == "web":
        return lambda: healthy(cp.url)
    line = {"celery-worker": " ready.", "celery-beat": "beat: Starting..."}[name]
    path = cp.child_log(name)
    before = path.read_text().count(line)
    return lambda: path.read_text().count(line) > before


def beat_to_worker(cp: Stack) -> None:
    """Until the beat's sync_runs (every 10 s) goes through Redis to the worker again:
    both reconnected to a restarted Redis (or started after it)."""
    worker_log = cp.child_log("celery-worker")
    seen = len(worker_log.read_text())
    wait_for("the beat's sync_runs done by the worker", lambda: re.search(
        r"jobs\.runs\.tasks\.sync_runs\[[\w-]+\] succeeded", worker_log.read_text()[seen:]),
        60, worker_log)


# One at a time, then every child but the Ray head at once (a control plane whose cluster
# lives on: the run goes on, spooling, while nothing answers it).
OUTAGES = [("redis",), ("celery-worker",), ("web",),
           ("redis", "celery-worker", "celery-beat", "web")]


@pytest.mark.timeout(600)
def test_the_stack_restarts_redis_the_worker_and_the_web_server_killed_mid_run(stack):
    run_id = stack.launch(CONFIG)
    stored = wait_events(stack, run_id, 20, "the run under way")

    figures, all_killed = [], []
    for names in OUTAGES:
        back_at_work = [answering(stack, name) for name in names]
        killed_pids = [stack.kill_child(name) for name in names]
        killed = time.monotonic()
        all_killed += killed_pids
        for name, pid in zip(names, killed_pids, strict=True):
            wait_for(f"{name} restarted", lambda n=name, p=pid: stack.restarted(n, p), 60,
                     stack.log)
        wait_for(f"{' + '.join(names)} back at work", lambda b=back_at_work: all(
            ready() for ready in b), 120, stack.log)
        figures.append(f"{' + '.join(names)} {time.monotonic() - killed:.1f}s")
        if "redis" in names:
            beat_to_worker(stack)
        stored = wait_events(stack, run_id, stored, f"after {' + '.join(names)} restarted")
    stack.api(f"/runs/{run_id}/stop", {})
    stopped_s = wait_status(stack, run_id, "stopped")

    n = stack.assert_every_event_stored_once(run_id)
    killed_names = sorted(name for names in OUTAGES for name in names)
    notes = stack.record().restarts
    assert not (extra := [n for n in notes if n["pid"] not in all_killed]), (
        stack.died_on_its_own(extra))
    assert sorted(n["child"] for n in notes) == killed_names, notes
    assert {n["exit"] for n in notes} == {"killed by signal 9"}, notes
    cluster = stack.browser.get("/cluster")
    listed = re.findall(r'<li class="stack-restart"><strong>([\w-]+)</strong>', cluster)
    assert sorted(listed) == killed_names, listed
    print(f"\nstack children SIGKILLed mid-run, back at work after: {', '.join(figures)} "
          f"(restart delay {RESTART_DELAY_S} s, doubled per restart); {n} events, 0 lost, "
          f"0 twice; the run stopped {stopped_s:.1f}s after the operator asked")


@pytest.mark.timeout(600)
def test_after_the_whole_stack_is_killed_at_a_checkpoint_the_run_is_lost_and_forks(stack):
    run_id = stack.launch(CHECKPOINTED)
    checkpoints = stack.runs_dir / f"run-{run_id}" / "checkpoints"
    wait_for("a finished checkpoint", lambda: any(
        (d / "state.json").exists() for d in checkpoints.glob("step_*")), 240, stack.log)
    stack.kill_everything()
    step = finished_checkpoints(checkpoints)[0]
    listed_before = query(stack.db, "SELECT step FROM jobs_checkpoint WHERE run_id = ?", run_id)
    stored_before = len(stored_seqs(stack.db, run_id))

    restart_s = stack.start()
    lost_s = wait_status(stack, run_id, "lost", 120)
    run = stack.api(f"/runs/{run_id}")
    assert "Ray has no job" in run["status_reason"], run["status_reason"]
    on_disk = finished_checkpoints(checkpoints)         # the driver is dead: final
    listed = {c["step"]: c for c in stack.api(f"/runs/{run_id}/checkpoints")}
    assert step in listed and sorted(listed) == on_disk, (sorted(listed), on_disk)
    n = stack.assert_every_event_stored_once(run_id)
    latest = on_disk[-1]

    fork = stack.api(f"/runs/{run_id}/fork", {"checkpoint": listed[latest]["id"],
                                              "config": {"steps": latest + FORK_STEPS}})
    running_s = wait_status(stack, fork["id"], "running", 240)
    wait_status(stack, fork["id"], "succeeded")
    fork_steps = [int(e["step"]) for e in stack.emitted(fork["id"])
                  if e["type"] == "metrics.append" and "time/step_s" in e["values"]]
    # step_N holds N trained steps (0..N-1): the fork resumes at step N
    assert fork_steps == list(range(latest, latest + FORK_STEPS)), fork_steps
    stack.assert_every_event_stored_once(fork["id"])
    print(f"\nwhole stack SIGKILLed after the step-{step} checkpoint (listed before the "
          f"kill: {step in {s for (s,) in listed_before}}): stack ready again "
          f"{restart_s:.1f}s after the start, run lost {lost_s:.1f}s later; checkpoints on "
          f"disk {on_disk}, all listed; {n} events ({stored_before} stored before the "
          f"kill), 0 lost, 0 twice; a fork from step {latest} running {running_s:.1f}s "
          f"after its launch, trained steps {fork_steps[0]}..{fork_steps[-1]}")


def finished_checkpoints(root: Path) -> list[int]:
    """The steps of the checkpoints the driver finished (state.json written last)."""
    return sorted(int(d.name.removeprefix("step_")) for d in root.glob("step_*")
                  if (d / "state.json").exists())
