"""Ingest throughput from many runs at once, and websocket fan-out latency under that load,
through the real stack on loopback.

    setup      a throwaway database: with --database-url postgresql://.../db a new database
               rlplane_bench_<pid> on that server (dropped at the end), else a SQLite file
               in a temp dir; migrated; runs with ingest tokens, a user with a session
               uvicorn bench.ingest_asgi:application (controlplane.asgi, each broadcast
               stamped with its commit time), --workers processes, its own session
               a Celery worker (the stack's command), which runs the debounced alert rules
               channel layer and broker: Redis at --redis-url (default .../13)
    ingest     --runs sender processes, one run each, POST the HTTP sink's batches
               ({"events": [event.to_dict(), ...]}, --batch events: per step one
               metrics.append of --values values and a span per phase; the body written
               from a template, Batches) to
               /api/runs/<id>/events as fast as they are answered, for --seconds; every
               --replay-every'th batch is posted twice (a retry whose answer was lost) and
               its second answer must say "all duplicates".
               Figures: metric values stored per second; the CPU each role used per POST
               (PostgreSQL's processes, the uvicorn and Celery process groups, the senders'
               own), which says where the machine went. Then the database is counted
               against what the senders were told: events lost (acknowledged, not
               stored), doubled (a (run, seq) twice) and metric points missing.
    limit      (PostgreSQL) the same rows (events, metric points, spans) under other runs,
               written by one raw COPY per table in one transaction, --limit-rounds
               times: the fastest one's values/s, and the ingest's ratio to it.
    fanout     (--fanout, during the ingest phase) --watchers websocket clients on one
               run, and --spread clients on each of 10 other runs, served by the ingest's
               uvicorn or (--ws-workers N) one of their own, as a proxy routing /ws/ would
               (--ws-nice -10: weighted on the CPU as deploy/'s rlplane-ws unit is);
               once every client got a warm-up event, a poster per watched run sends one
               small batch every --interval s; each client records receipt - the batch's
               commit time. --slow clients on the first run stop
               reading after their first message (their TCP window fills): the others'
               figures show whether they wait for them.
               Figures: p50 / p99 / max per group; every event counted at every client,
               live (timed) or refilled from the database after the channel layer dropped
               a message for a socket that fell behind (not timed), or missed; and the
               server's side: commit -> handed to the socket.

    .venv/bin/python bench/ingest.py --runs 100 --workers 2 --seconds 45 --fanout \\
        --ws-workers 2 --ws-nice -10 --database-url postgresql://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.fanout import STAGES, watch  # noqa: E402
from bench.ingest_stack import (  # noqa: E402
    Database,
    cpu_times,
    create_runs,
    evaluations_drained,
    flush_redis,
    free_port,
    role_cpu,
    session_cookie,
    setup_django,
    start_server,
    start_worker,
    stop,
)
from engine import metrics as M  # noqa: E402
from engine.api import MetricsEvent, SpanEvent  # noqa: E402

PHASES = ("rollout", "reward", "learner", "weight_sync")
SPREAD_RUNS = 10
AUTOGROUP = Path("/proc/sys/kernel/sched_autogroup_enabled")


def metric_names(count: int) -> list[str]:
    """Canonical names (engine/metrics.py), padded with per-device utilization."""
    names = [n for n in M.METRICS if "<" not in n][:count // 2]
    return names + [M.DEVICE_UTILIZATION.of(device=f"cpu:{i}")
                    for i in range(count - len(names))]


def step_events(seq: int, step: int, names: list[str], ts: float) -> list[dict]:
    """One training step as the engine reports it: its spans, then its metrics."""
    spans = [SpanEvent(seq=seq + i, ts=ts, device="cpu:0", phase=phase, start=ts - 1 + i / 4,
                       end=ts - 1 + (i + 1) / 4, step=step, version=step).to_dict()
             for i, phase in enumerate(PHASES)]
    values = {name: float(step % 97) + i / 10 for i, name in enumerate(names)}
    return spans + [MetricsEvent(seq=seq + len(PHASES), ts=ts, step=step,
                                 values=values).to_dict()]


EVENTS_PER_STEP = len(PHASES) + 1


def batch_events(seq: int, step: int, names: list[str], size: int, ts: float) -> list[dict]:
    """A full batch of the HTTP sink's: the whole steps from (seq, step) that fit in
    ``size`` events."""
    return [event for i in range(size // EVENTS_PER_STEP)
            for event in step_events(seq + i * EVENTS_PER_STEP, step + i, names, ts)]


class Batches:
    """batch_events(...)'s JSON body, written from a template: the bench's senders run on
    the machine they load, and building each batch's events and encoding them cost about
    a tenth of its CPU, which a driver spends on its own node. Each metrics event's values
    repeat every 97 steps (step_events), so their JSON is made once; the rest is seqs,
    steps and times. ``check`` compares a body with json.dumps of the events themselves."""

    def __init__(self, names: list[str]):
        self.names = names
        self.values = [json.dumps(step_events(0, r, names, 0.0)[-1]["values"])
                       for r in range(97)]

    def body(self, seq: int, step: int, size: int, ts: float) -> str:
        steps = []
        for k in range(size // EVENTS_PER_STEP):
            at, st = seq + k * EVENTS_PER_STEP, step + k
            steps += [f'{{"type": "span", "seq": {at + i}, "ts": {ts!r}, "device": "cpu:0", '
                      f'"phase": "{phase}", "start": {ts - 1 + i / 4!r}, '
                      f'"end": {ts - 1 + (i + 1) / 4!r}, "step": {st}, "version": {st}}}'
                      for i, phase in enumerate(PHASES)]
            steps.append(f'{{"type": "metrics.append", "seq": {at + len(PHASES)}, '
                         f'"ts": {ts!r}, "step": {st}, "values": {self.values[st % 97]}}}')
        return '{"events": [' + ", ".join(steps) + "]}"

    def check(self, seq: int, step: int, size: int, ts: float) -> None:
        made = json.dumps({"events": batch_events(seq, step, self.names, size, ts)})
        if self.body(seq, step, size, ts) != made:
            raise RuntimeError("bench/ingest.py's batch template no longer writes what "
                               "json.dumps of the engine's events does: update Batches")


# A watched run's seq 1, posted once every client is connecting: a client counts from the
# event after it, so the figures leave out the server's work of opening the sockets (each
# one's backfill and alert rows, once).
WARM_UP = json.dumps({"events": [MetricsEvent(seq=1, ts=0.0, step=0,
                                              values={"reward/mean": 0.0}).to_dict()]})


class Poster:
    """One keep-alive HTTP connection posting a run's batches."""

    def __init__(self, port: int, run_id: int, token: str):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.path = f"/api/runs/{run_id}/events"
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def post(self, body: str) -> dict:
        self.conn.request("POST", self.path, body, self.headers)
        response = self.conn.getresponse()
        answer = json.loads(response.read())
        if response.status != 200:
            raise RuntimeError(f"ingest answered {response.status}: {answer}")
        return answer


def send(port: int, run_id: int, token: str, batch: int, values: int, deadline: float,
         replay_every: int, results) -> None:
    """A sender process: full batches until the deadline (the sink's backlog case)."""
    batches = Batches(metric_names(values))
    batches.check(1, 0, batch, time.time())
    poster, seq, step, posts = Poster(port, run_id, token), 1, 0, 0
    acked = {"run_id": run_id, "events": 0, "steps": 0, "posts": 0, "replays": 0,
             "replays_wrong": 0, "error": None, "cpu_s": 0.0}
    cpu_began = time.process_time()
    try:
        while time.time() < deadline:
            count = batch // EVENTS_PER_STEP * EVENTS_PER_STEP
            body = batches.body(seq, step, batch, time.time())
            seq, step = seq + count, step + count // EVENTS_PER_STEP
            answer = poster.post(body)
            if answer["stored"] != count:
                raise RuntimeError(f"run {run_id}: {answer} for {count} new events")
            acked["events"] += count
            acked["steps"] += count // EVENTS_PER_STEP
            posts += 1
            if replay_every and posts % replay_every == 0:
                again = poster.post(body)
                acked["replays"] += 1
                acked["replays_wrong"] += (again["stored"], again["duplicates"]) != (
                    0, count)
        acked["posts"] = posts
    except BaseException as exc:  # reported by the parent
        acked["error"] = repr(exc)
    acked["cpu_s"] = time.process_time() - cpu_began
    results.put(acked)


# --- fan-out -----------------------------------------------------------------------------


def probe(port: int, run_id: int, token: str, interval: float, deadline: float) -> int:
    """Small batches (one metrics event) on a watched run until the deadline."""
    poster, seq = Poster(port, run_id, token), 1     # seq 1: the warm-up (WARM_UP)
    while time.time() < deadline:
        seq += 1
        poster.post(json.dumps({"events": [MetricsEvent(
            seq=seq, ts=time.time(), step=seq, values={"reward/mean": 0.5}).to_dict()]}))
        time.sleep(interval)
    return seq - 1


def sent_latencies(workdir: Path, run_ids: list[int]) -> list[float]:
    """Commit -> handed to a socket, for every live message to these runs' sockets, as
    the websocket server's processes logged them (bench/ingest_asgi.py)."""
    runs = set(run_ids)
    return [float(seconds) for log in (workdir / "sent").glob("sent-*.txt")
            for run_id, seconds in (line.split() for line in log.read_text().splitlines())
            if int(run_id) in runs]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --- counting ----------------------------------------------------------------------------


def count_stored(run_ids: list[int]) -> dict[int, tuple[int, int, int, int]]:
    """{run: (events, distinct seqs, highest seq, metric points)}."""
    from django.db.models import Count, Max

    from jobs.models import MetricPoint, RunEvent

    events = {r["run_id"]: r for r in RunEvent.objects.filter(run_id__in=run_ids)
              .values("run_id").annotate(n=Count("id"), seqs=Count("seq", distinct=True),
                                         top=Max("seq"))}
    points = dict(MetricPoint.objects.filter(run_id__in=run_ids).values("run_id")
                  .annotate(n=Count("id")).values_list("run_id", "n"))
    return {r: (events.get(r, {}).get("n", 0), events.get(r, {}).get("seqs", 0),
                events.get(r, {}).get("top", 0) or 0, points.get(r, 0)) for r in run_ids}


def copy_limit(sent: list[dict], values: int) -> tuple[int, float]:
    """The same rows the senders' acknowledged batches made, under new runs, written by
    a raw COPY per table in one transaction: (metric values, seconds)."""
    from django.db import connection

    from jobs.models import MetricPoint, PhaseSpan, RunEvent

    names = metric_names(values)
    targets = create_runs(len(sent), "copy")
    event_rows, point_rows, span_rows = [], [], []
    ts = time.time()
    for (run_id, _), acked in zip(targets, sent, strict=True):
        for step in range(acked["steps"]):
            for e in step_events(1 + step * EVENTS_PER_STEP, step, names, ts):
                event_rows.append((run_id, e["seq"], e["type"], e["ts"], json.dumps(e)))
                if e["type"] == "span":
                    span_rows.append((run_id, e["device"], e["phase"], e["start"], e["end"],
                                      e["step"], e["version"]))
                else:
                    point_rows += [(run_id, step, n, v) for n, v in e["values"].items()]
    tables = [(RunEvent, "run_id, seq, type, ts, payload", event_rows),
              (MetricPoint, "run_id, step, name, value", point_rows),
              (PhaseSpan, "run_id, device, phase, start, \"end\", step, version", span_rows)]
    connection.ensure_connection()
    conn = connection.connection
    began = time.perf_counter()
    with conn.transaction(), conn.cursor() as cursor:
        for model, columns, rows in tables:
            with cursor.copy(f"COPY {model._meta.db_table} ({columns}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
    return len(point_rows), time.perf_counter() - began


# --- main --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=4, help="sender processes, a run each")
    ap.add_argument("--batch", type=int, default=200,
                    help="events per POST (the HTTP sink's batch_size)")
    ap.add_argument("--values", type=int, default=64, help="metric values per step")
    ap.add_argument("--seconds", type=float, default=10.0, help="ingest phase length")
    ap.add_argument("--replay-every", type=int, default=10,
                    help="post every Nth batch twice (0: never)")
    ap.add_argument("--workers", type=int, default=2, help="uvicorn worker processes")
    ap.add_argument("--database-url", default=None,
                    help="a PostgreSQL server to make the bench's database on (default: "
                         "a SQLite file)")
    ap.add_argument("--fanout", action="store_true", help="websocket clients meanwhile")
    ap.add_argument("--ws-workers", type=int, default=0,
                    help="serve the websockets from a uvicorn of this many workers beside "
                         "the one that takes ingest (0: the same one)")
    ap.add_argument("--ws-nice", type=int, default=0,
                    help="(with --ws-workers; Linux's sched_autogroup) the websocket "
                         "server's CPU weight, as its session's autogroup nice: -10 weighs "
                         "it about as deploy/'s rlplane-ws unit does (CPUWeight=1000 "
                         "against the others' 100); the clients get the same in a session "
                         "of their own, standing in for browsers on other machines (Linux "
                         "applies it to processes in the root cpu cgroup only)")
    ap.add_argument("--watchers", type=int, default=100, help="clients on the one run")
    ap.add_argument("--spread", type=int, default=10,
                    help=f"clients on each of {SPREAD_RUNS} other runs")
    ap.add_argument("--slow", type=int, default=1, help="clients that stop reading")
    ap.add_argument("--interval", type=float, default=0.1,
                    help="seconds between a watched run's batches")
    ap.add_argument("--limit-rounds", type=int, default=2,
                    help="(PostgreSQL) raw COPYs of the same rows; the fastest is the limit "
                         "(0: none, no ratio)")
    ap.add_argument("--redis-url", default=os.environ.get(
        "BENCH_REDIS_URL", "redis://127.0.0.1:6379/13"))
    args = ap.parse_args(argv)
    if args.ws_nice and not args.ws_workers:
        ap.error("--ws-nice weighs the websocket server apart from ingest: give it "
                 "--ws-workers N too")
    if args.ws_nice and (not AUTOGROUP.exists() or AUTOGROUP.read_text().strip() != "1"):
        ap.error(f"--ws-nice needs the kernel's sched_autogroup ({AUTOGROUP} is not 1); "
                 "leave it out")
    if args.ws_nice < 0 and os.geteuid() != 0:
        ap.error("--ws-nice below 0 raises a priority, which takes root (CAP_SYS_NICE)")

    with tempfile.TemporaryDirectory(prefix="rlplane-bench-") as tmp:
        workdir = Path(tmp)
        database = Database(args.database_url, workdir)
        try:
            setup_django(database.url, args.redis_url)
            return run_bench(args, database, workdir)
        finally:
            database.drop()


def run_bench(args, database: Database, workdir: Path) -> dict:
    from django.db import connections

    flush_redis(args.redis_url)
    senders = create_runs(args.runs, "bench")
    watched = create_runs(1 + SPREAD_RUNS, "watched") if args.fanout else []
    cookie = session_cookie()
    connections.close_all()   # the forked senders must not share its socket
    port = free_port()
    (workdir / "sent").mkdir()
    os.environ["RLPLANE_BENCH_SENT_DIR"] = str(workdir / "sent")   # bench/ingest_asgi.py
    worker = start_worker(workdir / "celery.log")
    server = start_server(port, args.workers, workdir / "uvicorn.log")
    ws_server, ws_port = server, port
    if args.ws_workers:
        ws_port = free_port()
        ws_server = start_server(ws_port, args.ws_workers, workdir / "uvicorn-ws.log")
    ctx = multiprocessing.get_context("fork")
    results, fan_results = ctx.Queue(), ctx.Queue()
    watchers = []
    go, probed_all = ctx.Event(), ctx.Event()
    try:
        if args.ws_nice:   # its session, so its workers too; a process's nice stops there
            Path(f"/proc/{ws_server.pid}/autogroup").write_text(str(args.ws_nice))
        if args.fanout:
            one, spread = watched[0][0], [r for r, _ in watched[1:]]
            plan = [[("one run", [one], args.watchers // 2)],
                    [("one run", [one], args.watchers - args.watchers // 2)],
                    [(f"{SPREAD_RUNS} runs", spread, args.spread)]]
            for i, groups in enumerate(plan):
                ready = ctx.Event()
                proc = ctx.Process(target=watch, args=(
                    ws_port, cookie, groups, args.slow if i == 0 else 0, one, ready, go,
                    probed_all, fan_results, args.ws_nice))
                proc.start()
                watchers.append((proc, ready))
            for run_id, token in watched:
                Poster(ws_port, run_id, token).post(WARM_UP)
            for _, ready in watchers:
                if not ready.wait(300):
                    raise RuntimeError("the websocket clients did not all get the warm-up")
        groups = {"server": server.pid, "alerts": worker.pid}
        if ws_server is not server:
            groups["websocket server"] = ws_server.pid
        began, cpu_began, roles_began = time.time(), cpu_times(), role_cpu(groups)
        deadline = began + args.seconds
        procs = [ctx.Process(target=send, args=(port, run_id, token, args.batch, args.values,
                                                deadline, args.replay_every, results))
                 for run_id, token in senders]
        for proc in procs:
            proc.start()
        go.set()
        probes = []
        if args.fanout:
            from concurrent.futures import ThreadPoolExecutor

            pool = ThreadPoolExecutor(len(watched))
            probes = [pool.submit(probe, port, run_id, token, args.interval, deadline)
                      for run_id, token in watched]
        sent = [results.get(timeout=args.seconds + 300) for _ in procs]
        elapsed = time.time() - began
        busy, total = (b - a for a, b in zip(cpu_began, cpu_times(), strict=True))
        load = {"cpu_busy": busy / max(1, total), "load_1min": os.getloadavg()[0],
                "cpu_s": {role: used - roles_began[role]
                          for role, used in role_cpu(groups).items()}}
        for proc in procs:
            proc.join()
        probed = {run_id: f.result() for (run_id, _), f in zip(watched, probes, strict=True)}
        probed_all.set()
        fanned = [fan_results.get(timeout=120) for _ in watchers]
        for proc, _ in watchers:
            proc.join()
        drain_s = evaluations_drained(args.redis_url)
    except BaseException:
        for log in sorted(workdir.glob("*.log")):
            print(f"--- {log.name} (its end)\n{log.read_text()[-20000:]}", file=sys.stderr)
        raise
    finally:
        stop(server)
        stop(ws_server)
        stop(worker)
        for proc, _ in watchers:
            if proc.is_alive():
                proc.kill()
        flush_redis(args.redis_url)
    load["cpu_s"]["senders"] = sum(s["cpu_s"] for s in sent)
    errors = [s["error"] for s in sent if s["error"]]
    if errors:
        log = (workdir / "uvicorn.log").read_text()
        first = max(0, log.find("Internal Server Error"))
        print(f"--- uvicorn.log (its first 500)\n{log[first:first + 8000]}", file=sys.stderr)
        raise RuntimeError(f"{len(errors)} senders failed, the first: {errors[0]}")
    return report(args, database, workdir, sent, elapsed, probed, fanned, drain_s, load)


def report(args, database, workdir, sent, elapsed, probed, fanned, drain_s, load) -> dict:
    stored = count_stored([s["run_id"] for s in sent])
    acked_events = sum(s["events"] for s in sent)
    values = sum(s["steps"] for s in sent) * args.values
    lost = sum(max(0, s["events"] - stored[s["run_id"]][0]) for s in sent)
    extra = sum(max(0, stored[s["run_id"]][0] - s["events"]) for s in sent)
    doubled = sum(n - seqs for n, seqs, _, _ in stored.values())
    points = sum(p for _, _, _, p in stored.values())
    evaluations = sum("evaluate_run_alerts[" in line and "succeeded" in line
                      for line in (workdir / "celery.log").read_text().splitlines())
    result = {
        "runs": args.runs, "workers": args.workers, "batch_events": args.batch,
        "values_per_step": args.values, "database": "postgresql" if database.postgres
        else "sqlite", "seconds": elapsed, "posts": sum(s["posts"] for s in sent),
        "events": acked_events, "values": values, "values_per_s": values / elapsed,
        "events_lost": lost, "events_unexpected": extra, "events_doubled": doubled,
        "points_missing": values - points,
        "replays": sum(s["replays"] for s in sent),
        "replays_wrong": sum(s["replays_wrong"] for s in sent),
        "alert_evaluations": evaluations, "alert_drain_s": drain_s, **load,
    }
    print(f"ingest ({result['database']}, {args.runs} sender processes, {args.workers} uvicorn "
          f"workers): {result['values_per_s']:,.0f} metric values/s ({values:,} values, "
          f"{acked_events:,} events in {result['posts']:,} POSTs of {args.batch} events, "
          f"{elapsed:.1f} s); the machine's CPUs {100 * load['cpu_busy']:.0f} % busy, load "
          f"average {load['load_1min']:.1f} at the end")
    posts = max(1, result["posts"])
    if not database.postgres:
        load["cpu_s"].pop("database")  # SQLite is in the server's processes
    print("CPU per POST by role (ms): " + ", ".join(
        f"{role} {1000 * used / posts:.1f}" for role, used in load["cpu_s"].items())
        + f"; {sum(load['cpu_s'].values()) / elapsed:.2f} of the machine's {os.cpu_count()} "
        "cores in all")
    print(f"counted: {lost} events lost, {doubled} doubled, {extra} unexpected, "
          f"{result['points_missing']} metric points missing; {result['replays']} replayed "
          f"batches, {result['replays_wrong']} not answered as all duplicates; "
          f"{evaluations} debounced alert evaluations, the last queued one started "
          f"{drain_s:.1f} s after the senders stopped")
    if database.postgres and args.limit_rounds > 0:
        # The fastest of a few: one COPY on a shared machine swung 120-170k values/s
        # from run to run, and the ratio with it; the best is the limit.
        rounds = [copy_limit(sent, args.values) for _ in range(args.limit_rounds)]
        copied, seconds = min(rounds, key=lambda r: r[1])
        result.update(copy_values_per_s=copied / seconds,
                      ratio=result["values_per_s"] / (copied / seconds))
        print(f"raw COPY of the same rows: {result['copy_values_per_s']:,.0f} metric values/s "
              f"({copied:,} values, {seconds:.1f} s; the best of "
              f"{', '.join(f'{copied / s:,.0f}' for _, s in rounds)}); "
              f"ingest / COPY = {result['ratio']:.2f}")
    failed = [f["error"] for f in fanned if "error" in f]
    if failed:
        raise RuntimeError(f"a websocket client process failed: {failed[0]}")
    client_errors = [e for f in fanned for e in f["errors"]]
    if client_errors:
        print(f"{len(client_errors)} websocket clients failed, the first: {client_errors[0]}")
    for fan in fanned:
        for name, latencies in fan["latencies"].items():
            result.setdefault("fanout", {}).setdefault(name, []).extend(latencies)
    for name, latencies in result.get("fanout", {}).items():
        clients = sum(len(f["seen"].get(name, [])) for f in fanned)
        expected = sum(probed[run_id] for f in fanned for run_id, _ in f["seen"].get(name, []))
        missed = expected - sum(count for f in fanned for _, count in f["seen"].get(name, []))
        refilled = sum(f["backfilled"].get(name, 0) for f in fanned)
        stats = {"clients": clients, "deliveries": len(latencies), "backfilled": refilled,
                 "p50_ms": 1000 * percentile(latencies, 0.5) if latencies else None,
                 "p99_ms": 1000 * percentile(latencies, 0.99) if latencies else None,
                 "max_ms": 1000 * max(latencies) if latencies else None,
                 "missed": missed}
        result[f"fanout {name}"] = stats
        weighed = f", server and clients at autogroup nice {args.ws_nice}" if args.ws_nice else ""
        print(f"fan-out, {name} ({clients} clients"
              f"{f', {args.slow} slow beside them' if name == 'one run' and args.slow else ''}"
              f"{weighed}): {len(latencies):,} deliveries, commit -> client p50 "
              f"{stats['p50_ms']:.1f} ms, p99 {stats['p99_ms']:.1f} ms, max "
              f"{stats['max_ms']:.1f} ms; {refilled:,} more "
              f"refilled from the database (a dropped message), {missed} of {expected:,} missed")
        handed = sent_latencies(workdir, [run_id for f in fanned
                                          for run_id, _ in f["seen"].get(name, [])])
        if handed:
            print(f"    server side, commit -> handed to the socket: p50 "
                  f"{1000 * percentile(handed, 0.5):.1f} ms, p99 "
                  f"{1000 * percentile(handed, 0.99):.1f} ms ({len(handed):,} sends)")
        timed = [row for f in fanned for row in f["stages"].get(name, [])]
        if timed:
            print("    stages, p50 / p99 ms: " + ", ".join(
                f"{stage} {1000 * percentile(column, 0.5):.1f} / "
                f"{1000 * percentile(column, 0.99):.1f}"
                for stage, column in zip(STAGES, zip(*timed, strict=True), strict=True)))
    result.pop("fanout", None)
    return result


if __name__ == "__main__":
    main()
