"""Ingest throughput and websocket delivery latency, through the real stack on loopback.

    setup     temp dir: SQLite file DB (migrated), a user with a session, runs with tokens
              uvicorn controlplane.asgi on a free port (its own session, killed at the end)
              channel layer: Redis at REDIS_URL (default redis://127.0.0.1:6379/13)
    (a)       N senders, one run each, POST batches of metrics.append events (~40 values
              each) to /api/runs/<id>/events for --seconds; every batch is stored and
              group_sent before it is answered. Figure: metric values stored per second,
              checked against the database afterwards.
    (b)       20 websockets on ws/runs/<id>/ (session cookie), one poster sends one event
              per request with its send time as ``ts``; each client records receive - ts.
              Figure: p50 / p99 over every (client, event).

    .venv/bin/python bench/ingest.py [--senders 4] [--seconds 10] [--clients 20]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine import metrics as M  # noqa: E402

VALUES_PER_EVENT = 40
# The canonical names (engine/metrics.py), padded with devices to VALUES_PER_EVENT values.
METRIC_NAMES = list(M.METRICS)[:VALUES_PER_EVENT // 2]
METRIC_NAMES += [M.DEVICE_UTILIZATION.of(device=f"cpu:{i}")
                 for i in range(VALUES_PER_EVENT - len(METRIC_NAMES))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metrics_event(seq: int, ts: float) -> dict:
    values = {name: float(seq % 97) + i / 10 for i, name in enumerate(METRIC_NAMES)}
    return {"type": "metrics.append", "seq": seq, "ts": ts, "step": seq, "values": values}


class Poster:
    """One keep-alive HTTP connection posting a run's batches."""

    def __init__(self, port: int, run_id: int, token: str):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self.path = f"/api/runs/{run_id}/events"
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def post(self, events: list[dict]) -> dict:
        self.conn.request("POST", self.path, json.dumps({"events": events}), self.headers)
        response = self.conn.getresponse()
        body = json.loads(response.read())
        if response.status != 200:
            raise RuntimeError(f"ingest answered {response.status}: {body}")
        return body


def measure_throughput(port: int, runs: list[tuple[int, str]], batch: int,
                       seconds: float) -> tuple[int, float]:
    """Metric values stored by all senders together, and the seconds they took."""
    stored = [0] * len(runs)
    errors: list[BaseException] = []
    start = time.perf_counter()
    deadline = start + seconds

    def send(index: int, run_id: int, token: str) -> None:
        poster, seq = Poster(port, run_id, token), 0
        try:
            while time.perf_counter() < deadline:
                events = [metrics_event(seq + i + 1, time.time()) for i in range(batch)]
                seq += batch
                stored[index] += poster.post(events)["stored"] * VALUES_PER_EVENT
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=send, args=(i, *run)) for i, run in enumerate(runs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return sum(stored), time.perf_counter() - start


async def measure_latency(port: int, run_id: int, token: str, cookie: str, clients: int,
                          events: int, interval_s: float) -> list[float]:
    import websockets

    latencies: list[float] = []
    url = f"ws://127.0.0.1:{port}/ws/runs/{run_id}/"

    async def client(ready: asyncio.Event, started: list) -> None:
        async with websockets.connect(url, origin=f"http://127.0.0.1:{port}",
                                      additional_headers={"Cookie": cookie},
                                      max_size=None) as ws:
            await ws.send(json.dumps({"last_seq": 0}))
            started.append(1)
            if len(started) == clients:
                ready.set()
            seen = 0
            while seen < events:
                message = json.loads(await asyncio.wait_for(ws.recv(), timeout=30))
                now = time.time()
                for event in message.get("events", []):
                    latencies.append(now - event["ts"])
                    seen += 1

    ready, started = asyncio.Event(), []
    tasks = [asyncio.create_task(client(ready, started)) for _ in range(clients)]
    await asyncio.wait_for(ready.wait(), timeout=30)
    await asyncio.sleep(0.5)  # every socket has joined its group and sent its last seq

    def post_all() -> None:
        poster = Poster(port, run_id, token)
        for seq in range(1, events + 1):
            poster.post([metrics_event(seq, time.time())])
            time.sleep(interval_s)

    await asyncio.to_thread(post_all)
    await asyncio.gather(*tasks)
    return latencies


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def setup_django(workdir: Path, redis_url: str) -> None:
    os.environ.update({
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "DATABASE_URL": f"sqlite:///{workdir / 'bench.sqlite3'}",
        "REDIS_URL": redis_url,
        "RLPLANE_ALLOWED_HOSTS": "127.0.0.1,localhost",
    })
    sys.path.insert(0, str(ROOT))
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def create_world(runs: int) -> tuple[list[tuple[int, str]], str]:
    """Runs with ingest tokens, and a logged-in user's session cookie."""
    from django.contrib.auth.models import User
    from django.test import Client

    from jobs.models import Run, RunStatus

    created = []
    for i in range(runs):
        run = Run.objects.create(name=f"bench-{i}", config={"name": f"bench-{i}", "steps": 1})
        Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
        created.append((run.pk, run.issue_ingest_token()))
    client = Client()
    client.force_login(User.objects.create_user("bench"))
    return created, f"sessionid={client.cookies['sessionid'].value}"


def start_server(port: int, log_path: Path) -> subprocess.Popen:
    log = log_path.open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "controlplane.asgi:application", "--host",
         "127.0.0.1", "--port", str(port), "--log-level", "warning", "--no-access-log"],
        cwd=ROOT, env=os.environ.copy(), stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc
        except OSError:
            time.sleep(0.2)
    stop_server(proc)
    raise RuntimeError(f"uvicorn did not start:\n{log_path.read_text()}")


def stop_server(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass


def flush_channel_layer(redis_url: str) -> None:
    """Drop the bench's channel-layer keys (its runs' group names repeat across runs)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter("asgi*", count=1000))
    if keys:
        client.delete(*keys)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--senders", type=int, default=4, help="concurrent senders, a run each")
    ap.add_argument("--batch", type=int, default=16, help="metrics.append events per POST")
    ap.add_argument("--seconds", type=float, default=10.0, help="throughput phase length")
    ap.add_argument("--clients", type=int, default=20, help="websocket clients")
    ap.add_argument("--events", type=int, default=200, help="events in the latency phase")
    ap.add_argument("--interval", type=float, default=0.02, help="seconds between them")
    ap.add_argument("--redis-url", default=os.environ.get(
        "BENCH_REDIS_URL", "redis://127.0.0.1:6379/13"))
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="rlplane-bench-") as tmp:
        workdir = Path(tmp)
        setup_django(workdir, args.redis_url)
        flush_channel_layer(args.redis_url)
        runs, cookie = create_world(args.senders + 1)
        port = free_port()
        server = start_server(port, workdir / "uvicorn.log")
        try:
            values, elapsed = measure_throughput(port, runs[:-1], args.batch, args.seconds)
            latency_run, token = runs[-1]
            latencies = asyncio.run(measure_latency(
                port, latency_run, token, cookie, args.clients, args.events, args.interval))
        finally:
            stop_server(server)
            flush_channel_layer(args.redis_url)
        from jobs.models import MetricPoint

        in_db = MetricPoint.objects.filter(run_id__in=[r for r, _ in runs[:-1]]).count()
    if in_db != values:
        raise RuntimeError(f"senders were told {values} values were stored; the DB has {in_db}")
    result = {
        "senders": args.senders, "batch_events": args.batch,
        "values_per_event": VALUES_PER_EVENT, "values": values, "seconds": elapsed,
        "values_per_s": values / elapsed,
        "events_per_s": values / VALUES_PER_EVENT / elapsed,
        "clients": args.clients, "deliveries": len(latencies),
        "latency_p50_ms": 1000 * statistics.median(latencies),
        "latency_p99_ms": 1000 * percentile(latencies, 0.99),
    }
    print(f"ingest: {result['values_per_s']:,.0f} metric values/s "
          f"({result['events_per_s']:,.0f} events/s; {args.senders} senders x "
          f"{args.batch} events x {VALUES_PER_EVENT} values per POST; "
          f"{values:,} values in {elapsed:.1f} s, all in the DB)")
    print(f"websocket delivery, {args.clients} clients, {len(latencies)} deliveries: "
          f"p50 {result['latency_p50_ms']:.1f} ms, p99 {result['latency_p99_ms']:.1f} ms")
    return result


if __name__ == "__main__":
    main()
