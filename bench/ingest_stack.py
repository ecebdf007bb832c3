"""The stack bench/ingest.py and bench/alert_evaluation.py stand up, and how they watch it:
a throwaway database (Database, setup_django, create_runs), uvicorn and a Celery worker
(start_server, start_worker, stop), the Redis keys they leave (flush_redis,
evaluations_drained), and the machine's CPU by role (cpu_times, role_cpu)."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent


class Database:
    """The bench's own database: a new PostgreSQL database beside the given URL's, or a
    SQLite file in ``workdir``; ``url`` is what DATABASE_URL is set to."""

    def __init__(self, base_url: str | None, workdir: Path):
        self.base_url, self.name = base_url, None
        if base_url is None:
            self.url = f"sqlite:///{workdir / 'bench.sqlite3'}"
            return
        import psycopg

        self.name = f"rlplane_bench_{os.getpid()}"
        with psycopg.connect(self.dsn(base_url), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {self.name}")
        parts = urlsplit(base_url)
        self.url = urlunsplit(parts._replace(path=f"/{self.name}"))

    @staticmethod
    def dsn(url: str) -> str:
        return urlunsplit(urlsplit(url)._replace(scheme="postgresql"))

    @property
    def postgres(self) -> bool:
        return self.name is not None

    def drop(self) -> None:
        if self.name is None:
            return
        import psycopg
        from django.db import connections

        connections.close_all()
        with psycopg.connect(self.dsn(self.base_url), autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)")


def setup_django(database_url: str, redis_url: str) -> None:
    os.environ.update({
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "DATABASE_URL": database_url,
        "REDIS_URL": redis_url,
        "RLPLANE_ALLOWED_HOSTS": "127.0.0.1,localhost",
    })
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def create_runs(count: int, prefix: str) -> list[tuple[int, str]]:
    from jobs.models import Run, RunStatus

    created = []
    for i in range(count):
        run = Run.objects.create(name=f"{prefix}-{i}", config={"name": prefix, "steps": 1})
        Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
        created.append((run.pk, run.issue_ingest_token()))
    return created


def session_cookie() -> str:
    from django.contrib.auth.models import User
    from django.test import Client

    client = Client()
    client.force_login(User.objects.create_user("bench"))
    return f"sessionid={client.cookies['sessionid'].value}"


def start(argv: list[str], log_path: Path) -> subprocess.Popen:
    return subprocess.Popen(argv, cwd=ROOT, env=os.environ.copy(), stdout=log_path.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def start_server(port: int, workers: int, log_path: Path) -> subprocess.Popen:
    proc = start([sys.executable, "-m", "uvicorn", "bench.ingest_asgi:application",
                  "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers),
                  "--log-level", "warning", "--no-access-log",
                  "--ws-per-message-deflate", "false"], log_path)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return proc
        except OSError:
            time.sleep(0.2)
    stop(proc)
    raise RuntimeError(f"uvicorn did not start:\n{log_path.read_text()}")


def start_worker(log_path: Path) -> subprocess.Popen:
    """The stack's Celery worker command (controlplane.stack.service_argv)."""
    from controlplane.stack import service_argv

    argv = service_argv(sys.executable, "127.0.0.1", str(os.getpid()), "unused")
    proc = start(argv["celery-worker"], log_path)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if " ready." in log_path.read_text():
            return proc
        time.sleep(0.2)
    stop(proc)
    raise RuntimeError(f"the Celery worker did not start:\n{log_path.read_text()}")


def evaluations_drained(redis_url: str, timeout_s: float = 60.0) -> float:
    """Seconds until every queued alert evaluation has started (no due key is left)."""
    import redis

    client, began = redis.Redis.from_url(redis_url), time.monotonic()
    while any(client.scan_iter("rlplane:alerts-due:*", count=1000)):
        if time.monotonic() - began > timeout_s:
            raise RuntimeError(f"alert evaluations still queued after {timeout_s:.0f} s")
        time.sleep(0.05)
    return time.monotonic() - began


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass


def flush_redis(redis_url: str) -> None:
    """Drop the bench's channel-layer keys, queued tasks and alert due keys (its runs'
    ids repeat across benches on the bench's Redis database)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    for pattern in ("asgi*", "rlplane:alerts-due:*", "celery*", "_kombu*", "unacked*"):
        keys = list(client.scan_iter(pattern, count=1000))
        if keys:
            client.delete(*keys)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_times() -> tuple[int, int]:
    """(busy, all) jiffies of the machine so far (/proc/stat's first line)."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]   # idle, iowait
    return sum(fields) - idle, sum(fields)


def role_cpu(groups: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far by role (/proc/<pid>/stat: utime + stime, and cutime + cstime,
    what its children that exited and were reaped used): "database" for PostgreSQL's
    processes (the postmaster reaps the backends a closed connection ends), else the role
    whose process group ({role: pgid}: uvicorn and its workers, the Celery worker and its
    pool) the process is in. The senders count their own."""
    tick, used = os.sysconf("SC_CLK_TCK"), dict.fromkeys(["database", *groups], 0.0)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            name, rest = stat.read_text().split("(", 1)[1].rsplit(")", 1)
        except (OSError, ValueError):
            continue
        fields = rest.split()
        role = "database" if name.startswith("postgres") else next(
            (r for r, pgid in groups.items() if int(fields[2]) == pgid), None)
        if role is not None:
            used[role] += sum(int(f) for f in fields[11:15]) / tick
    return used
