"""History that stays fast: the run page, the runs list and compare at 100k steps per run
and 1,000 runs in the database, and what 10k steps cost on disk.

    setup     a throwaway database: a SQLite file in a temp dir (default), or with
              --database-url a PostgreSQL database created beside the one named and
              dropped at the end; migrated; a logged-in operator (Django's test Client,
              in-process: the times are the server's, no network)
    fill      --runs runs (finished, 20 steps of the list's metrics each), of which
              --long-runs have --steps steps of --names metrics (the charts' names): one
              filled by bulk rows (values as an engine reports them, a one-step spike),
              its tiers built by jobs.rollups.rebuild_rollups (what ingest keeps, every
              bucket but the open ones), its metrics.append events (RunEvent) too; the
              others are copies of its points and tiers (INSERT ... SELECT)
    bytes     after the first long run: the bytes of its points, tiers and events per
              10k steps (SQLite: dbstat; PostgreSQL: pg_total_relation_size, with indexes)
    measure   best and median of --repeat requests (after one warm-up) of
                the run page (GET /runs/<id>) and its chart data (json_script) bytes,
                the runs list (GET /),
                compare of the 6 long runs (GET /api/runs/compare, and the page),
                the API's run detail, metric names and 3 series of the first long run (and
                    beside them every raw point of the 3, the endpoint's read before), ingest's
                name check of one more step of it (jobs/ingest/name_cap.py),
                a Prometheus scrape with the long runs live,
              beside the old read of the same run page's series: every raw point
              (jobs.queries.history.raw_history), once
    ingest    --ingest-steps steps through jobs.ingest.store.do_ingest_events, one step
              per batch, into two runs: with the tiers kept and with derive_rollups a
              no-op, alternating; ms per batch each and the ratio

    .venv/bin/python bench/history.py [--runs 1000] [--long-runs 6] [--steps 100000]
        [--names 30] [--ingest-steps 1000]
        [--database-url postgres://postgres@127.0.0.1:5432/postgres]
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlencode, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONFIG = {"name": "bench", "steps": 100_000}
SPIKE_AT = 71_337


def timed(fn, repeat: int) -> tuple[float, float, object]:
    """(best, median) seconds of ``repeat`` calls after a warm-up, and the last result."""
    result = fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times), result


def chart_names(count: int) -> list[str]:
    """``count`` names a native run reports, the ones the run page charts first."""
    from engine.api import metrics as M
    from jobs import charts
    read = sorted(n for n in charts.metric_names()
                  if "gpu:" not in n and not any(f"cpu:{k}" in n for k in range(2, 8)))
    rest = [n for n in M.METRICS if n not in read and "{" not in n]
    return (read + rest)[:count]


def value_of(step: int, k: int) -> float:
    return 50.0 if step == SPIKE_AT and k == 0 else math.sin(step / 300 + k) + k


def copy_rows(table: str, columns: list[str], rows) -> None:
    """Bulk rows: COPY on PostgreSQL, executemany on SQLite."""
    from django.db import connection
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            with cursor.cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        else:
            marks = ", ".join(["%s"] * len(columns))
            batch = []
            for row in rows:
                batch.append(row)
                if len(batch) == 50_000:
                    cursor.executemany(f"INSERT INTO {table} ({', '.join(columns)}) "
                                       f"VALUES ({marks})", batch)
                    batch = []
            if batch:
                cursor.executemany(f"INSERT INTO {table} ({', '.join(columns)}) "
                                   f"VALUES ({marks})", batch)


def table_bytes() -> dict[str, int]:
    """Bytes on disk of the three tables a run's history lives in, indexes included."""
    from django.db import connection
    tables = ["jobs_metricpoint", "jobs_metricrollup", "jobs_runevent"]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("CHECKPOINT")
            return {t: cursor.execute("SELECT pg_total_relation_size(%s)", [t]).fetchone()[0]
                    for t in tables}
        cursor.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        out = {}
        for t in tables:
            cursor.execute("SELECT name FROM sqlite_master WHERE tbl_name = %s "
                           "AND type IN ('table', 'index')", [t])
            objects = [r[0] for r in cursor.fetchall()]
            cursor.execute(f"SELECT SUM(pgsize) FROM dbstat WHERE name IN "
                           f"({', '.join(['%s'] * len(objects))})", objects)
            out[t] = cursor.fetchone()[0] or 0
        return out


def fill(args, names: list[str]):
    from django.contrib.auth.models import Group, User
    from django.db import connection, transaction
    from django.utils import timezone

    from engine.api import metrics as M
    from jobs.auth import OPERATOR_GROUP
    from jobs.models import MetricRollup, Run, RunStatus
    from jobs.rollups import TIERS, rebuild_rollups

    user = User.objects.create_user("bench")
    user.groups.add(Group.objects.get_or_create(name=OPERATOR_GROUP)[0])
    now = timezone.now()
    runs = Run.objects.bulk_create(
        Run(name=f"bench run {i}", config={**CONFIG, "name": f"bench-{i}"},
            status=RunStatus.SUCCEEDED, started_at=now, finished_at=now)
        for i in range(args.runs))
    long_runs, short_runs = runs[:args.long_runs], runs[args.long_runs:]
    listed = [M.REWARD_MEAN, M.TIME_STEP_S, M.EVAL_REWARD_MEAN]
    t0 = time.perf_counter()
    copy_rows("jobs_metricpoint", ["run_id", "step", "name", "value"],
              ((run.pk, step, name, 0.5) for run in short_runs for step in range(20)
               for name in listed))
    first = long_runs[0]
    before = table_bytes()
    with transaction.atomic():
        copy_rows("jobs_metricpoint", ["run_id", "step", "name", "value"],
                  ((first.pk, step, name, value_of(step, k)) for step in range(args.steps)
                   for k, name in enumerate(names)))
        rebuild_rollups(first)
        # Live, as ingest leaves it: each series' last bucket of every tier still open.
        for width in TIERS:
            MetricRollup.objects.filter(run=first, width=width,
                                        bucket=(args.steps - 1) // width).delete()
        copy_rows("jobs_runevent", ["run_id", "seq", "type", "ts", "payload"],
                  ((first.pk, step + 1, "metrics.append", 1e9 + step, json.dumps(
                      {"type": "metrics.append", "seq": step + 1, "ts": 1e9 + step,
                       "step": step, "values": {n: value_of(step, k)
                                                for k, n in enumerate(names)}}))
                   for step in range(args.steps)))
    after = table_bytes()
    per_10k = {t: (after[t] - before[t]) * 10_000 / args.steps for t in after}
    with transaction.atomic(), connection.cursor() as cursor:
        for run in long_runs[1:]:
            cursor.execute("INSERT INTO jobs_metricpoint (run_id, step, name, value) "
                           "SELECT %s, step, name, value FROM jobs_metricpoint "
                           "WHERE run_id = %s", [run.pk, first.pk])
            cols = ("name, width, bucket, count, total, low, low_step, high, high_step, "
                    "last_step, last, ts")
            cursor.execute(f"INSERT INTO jobs_metricrollup (run_id, {cols}) SELECT %s, {cols} "
                           "FROM jobs_metricrollup WHERE run_id = %s", [run.pk, first.pk])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    print(f"filled {args.runs} runs ({args.long_runs} of {args.steps:,} steps x "
          f"{len(names)} metrics) in {time.perf_counter() - t0:.0f} s", flush=True)
    return user, long_runs, per_10k


def measure(args, user, long_runs, names):
    from django.conf import settings
    from django.test import Client

    from engine.api import MetricsEvent
    from jobs.charts import downsample
    from jobs.ingest.name_cap import within_name_cap
    from jobs.models import MetricPoint, Run, RunStatus
    from jobs.queries import history
    from jobs.queries.run_page import chart_data

    client = Client(HTTP_HOST="localhost")
    client.force_login(user)
    first = long_runs[0]

    def get(url):
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)
        return response

    if args.profile:
        import cProfile
        import pstats

        from django.db import connection
        ids = ",".join(str(r.pk) for r in long_runs[:6])
        for url in (f"/runs/{first.pk}", f"/api/runs/compare?ids={ids}"):
            get(url)
            spent = []

            def clock(execute, sql, params, many, context, spent=spent):
                start = time.perf_counter()
                try:
                    return execute(sql, params, many, context)
                finally:
                    spent.append((time.perf_counter() - start, sql[:160]))
            with connection.execute_wrapper(clock):
                get(url)
            print(f"--- slowest queries of {url}")
            for seconds, sql in sorted(spent, reverse=True)[:8]:
                print(f"{seconds * 1000:8.1f} ms  {sql}")
        for url in (f"/runs/{first.pk}", "/"):
            get(url)
            profile = cProfile.Profile()
            profile.runcall(get, url)
            print(f"--- {url}")
            pstats.Stats(profile).sort_stats("cumulative").print_stats(40)
    rows = []
    best, med, page = timed(lambda: get(f"/runs/{first.pk}"), args.repeat)
    data = json.dumps(chart_data(first))
    rows.append(("run page (GET /runs/<id>)", best, med, len(page.content)))
    best_d, med_d, _ = timed(lambda: chart_data(first), args.repeat)
    rows.append(("  its chart data (chart_data)", best_d, med_d, len(data)))
    best, med, listed = timed(lambda: get("/"), args.repeat)
    rows.append((f"runs list (GET /, {args.runs:,} runs)", best, med, len(listed.content)))
    ids = ",".join(str(r.pk) for r in long_runs[:6])
    best, med, compared = timed(lambda: get(f"/api/runs/compare?ids={ids}"), args.repeat)
    rows.append((f"compare {min(6, len(long_runs))} long runs (API JSON)", best, med,
                 len(compared.content)))
    best, med, compared = timed(lambda: get(f"/runs/compare?ids={ids}"), args.repeat)
    rows.append(("  compare page (GET /runs/compare)", best, med, len(compared.content)))
    best, med, detail = timed(lambda: get(f"/api/v1/runs/{first.pk}"), args.repeat)
    rows.append(("run detail (GET /api/v1/runs/<id>)", best, med, len(detail.content)))
    best, med, listed = timed(lambda: get(f"/api/v1/runs/{first.pk}/metric-names"), args.repeat)
    rows.append(("  its metric names (API)", best, med, len(listed.content)))
    query = urlencode([("name", n) for n in names[:3]])
    best, med, got = timed(lambda: get(f"/api/v1/runs/{first.pk}/metrics?{query}"),
                           args.repeat)
    rows.append(("  3 of its series (API, 500 points each)", best, med, len(got.content)))

    def every_point():  # the API's read before it read tiers: each raw point, thinned
        by_name = {name: [] for name in names[:3]}
        for name, step, value in (MetricPoint.objects.filter(run=first, name__in=names[:3])
                                  .order_by("name", "step").values_list("name", "step", "value")):
            by_name[name].append((step, value))
        return {name: downsample(pts, 500) for name, pts in by_name.items()}
    best, med, _ = timed(every_point, args.repeat)
    rows.append(("  the same, every raw point read (as before)", best, med, 0))
    step = MetricsEvent(seq=1, ts=1e9, step=args.steps, values=dict.fromkeys(names, 0.5))
    best, med, _ = timed(lambda: within_name_cap(first, [step]), args.repeat)
    rows.append(("  ingest's name check of a step", best, med, 0))
    ids = [r.pk for r in long_runs]
    Run.objects.filter(pk__in=ids).update(status=RunStatus.RUNNING)
    settings.RLPLANE_METRICS_TOKEN = "bench"
    scrape = Client(HTTP_HOST="localhost", HTTP_AUTHORIZATION="Bearer bench")

    def scraped():
        response = scrape.get("/metrics")
        assert response.status_code == 200, ("/metrics", response.status_code)
        return response
    best, med, scraped = timed(scraped, args.repeat)
    rows.append((f"Prometheus scrape ({len(ids)} long runs live)", best, med,
                 len(scraped.content)))
    Run.objects.filter(pk__in=ids).update(status=RunStatus.SUCCEEDED)
    start = time.perf_counter()
    raw = history.raw_history(first, names)
    raw_s = time.perf_counter() - start
    return rows, raw_s, len(raw.steps)


def ingest_cost(args, names: list[str]) -> tuple[float, float]:
    """Seconds to ingest --ingest-steps steps (one step of ``names`` per batch, as a live
    run's sink sends them) into a fresh run, with the tiers kept and with
    derive_rollups made a no-op: the same events, side by side, alternating."""
    from django.conf import settings

    from engine.api import MetricsEvent
    from jobs.ingest import store
    from jobs.models import Run, RunStatus

    # Both arms send the same broadcasts; in memory, so the bench touches no shared Redis.
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    kept = store.derive_rollups
    spent = {True: 0.0, False: 0.0}
    runs = {tiers: Run.objects.create(name=f"ingest {tiers}", config=CONFIG,
                                      status=RunStatus.RUNNING) for tiers in spent}
    for step in range(args.ingest_steps):
        event = MetricsEvent(seq=step + 1, ts=1e9 + step, step=step,
                             values={n: value_of(step, k) for k, n in enumerate(names)})
        for tiers in (step % 2 == 0, step % 2 == 1):
            store.derive_rollups = kept if tiers else (lambda *args: None)
            start = time.perf_counter()
            store.do_ingest_events(runs[tiers], [event])
            spent[tiers] += time.perf_counter() - start
    store.derive_rollups = kept
    return spent[True], spent[False]


def run_bench(args) -> None:
    import django
    django.setup()
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    print(f"database: {connection.vendor}", flush=True)
    names = chart_names(args.names)
    user, long_runs, per_10k = fill(args, names)
    rows, raw_s, raw_steps = measure(args, user, long_runs, names)
    print(f"\n{'':44s} {'best ms':>9s} {'median ms':>10s} {'bytes':>11s}")
    for label, best, med, size in rows:
        print(f"{label:44s} {best * 1000:9.1f} {med * 1000:10.1f} {size:11,d}")
    print(f"\nold read of the run page's series (every raw point, {raw_steps:,} steps): "
          f"{raw_s * 1000:.0f} ms, {raw_s / rows[1][1]:.0f}x the chart data's best above")
    if args.ingest_steps:
        with_tiers, without = ingest_cost(args, names)
        per = 1000 / args.ingest_steps
        print(f"\ningest, one step of {len(names)} metrics per batch, {args.ingest_steps:,} "
              f"steps: {with_tiers * per:.2f} ms per batch with tiers kept, "
              f"{without * per:.2f} ms without; ratio {with_tiers / without:.2f}")
    print(f"\ndatabase bytes per 10k steps of {len(names)} metrics (one run):")
    for table, size in per_10k.items():
        print(f"  {table:22s} {size / 1e6:8.2f} MB")
    print(f"  {'all three':22s} {sum(per_10k.values()) / 1e6:8.2f} MB "
          f"({sum(per_10k.values()) / 10_000 / len(names):.0f} bytes per metric value)")
    print(f"  (raw points dropped by the retention: "
          f"{(per_10k['jobs_metricpoint']) / 1e6:.2f} MB of it)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1_000)
    parser.add_argument("--long-runs", type=int, default=6)
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--names", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile", action="store_true",
                        help="print where the run page's and the list's time goes")
    parser.add_argument("--ingest-steps", type=int, default=1_000,
                        help="steps ingested with and without tiers (0: skip)")
    parser.add_argument("--database-url", default="",
                        help="a PostgreSQL server's URL: a throwaway database is made there")
    args = parser.parse_args()
    if args.long_runs < 2 or args.runs < args.long_runs:
        parser.error(f"--long-runs {args.long_runs}: compare reads two or more long runs, "
                     f"and at most --runs ({args.runs}); give 2..{args.runs}")
    os.environ["DJANGO_SETTINGS_MODULE"] = "controlplane.settings"
    if not args.database_url:
        with tempfile.TemporaryDirectory() as tmp:
            os.environ["DATABASE_URL"] = f"sqlite:///{tmp}/bench.sqlite3"
            run_bench(args)
        return
    import psycopg
    parts = urlsplit(args.database_url)
    name = f"bench_history_{uuid.uuid4().hex[:8]}"
    admin = psycopg.connect(args.database_url, autocommit=True)
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        os.environ["DATABASE_URL"] = urlunsplit(parts._replace(path=f"/{name}"))
        run_bench(args)
    finally:
        from django.db import connections
        connections.close_all()
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


if __name__ == "__main__":
    sys.stdout = io.TextIOWrapper(sys.stdout.buffer, line_buffering=True)
    main()
