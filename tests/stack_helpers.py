"""Start a real control-plane stack for a test and wait until it is ready.

Shared by tests/test_stack.py and tests/e2e/test_browser.py: a supervisor subprocess
(`python -m controlplane.stack start --no-demo`) on a free port, its own state dir and
SQLite file, small Ray resources so two stacks fit on a 2-core box.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from controlplane import processes as proc
from controlplane.processes import StackRecord

REPO = Path(__file__).resolve().parent.parent


def start_stack(state: Path, db: Path, **env_overrides: str) -> subprocess.Popen:
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{db}", "RLPLANE_RAY_CPUS": "1",
           "RLPLANE_RAY_OBJECT_STORE_MB": "256", **env_overrides}
    env.pop(proc.STACK_MARKER, None)
    return subprocess.Popen(
        [sys.executable, "-m", "controlplane.stack", "start", "--state-dir", str(state),
         "--port", str(proc.free_port()), "--no-demo"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def wait_ready(state: Path, supervisor: subprocess.Popen, timeout_s: float = 120) -> StackRecord:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        record = proc.read_pid_file(state / "stack" / "stack.json")
        if record and record.ready and record.supervisor_pid == supervisor.pid:
            return record
        if supervisor.poll() is not None:
            pytest.fail(f"the stack exited ({supervisor.returncode}):\n{supervisor.stdout.read()}")
        time.sleep(0.3)
    pytest.fail("the stack was not ready in time")


@contextmanager
def running_stack(prefix: str, **env: str) -> Iterator[tuple[str, Path]]:
    """A started stack in a fresh /tmp state dir (short: Ray's unix sockets live under it):
    yields (web URL, state dir); stopped at the end, asserting it left no process."""
    state = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    supervisor = start_stack(state, state / "db.sqlite3", RLPLANE_RUNS_DIR=str(state / "runs"),
                             **env)
    try:
        record = wait_ready(state, supervisor)
        yield record.urls["web"].rstrip("/"), state
    finally:
        if supervisor.poll() is None:
            supervisor.send_signal(signal.SIGTERM)
            try:
                supervisor.wait(timeout=60)
            except subprocess.TimeoutExpired:
                supervisor.kill()
                supervisor.wait()
        proc.terminate(proc.marked_processes(str(state / "stack")), grace_s=2)
        left = proc.marked_processes(str(state / "stack"))
        shutil.rmtree(state, ignore_errors=True)
        assert left == set(), f"the stack left processes behind: {sorted(left)}"
