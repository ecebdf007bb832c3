"""What the run page charts: one row per (metric, step), one per phase span.

Rows are derived from RunEvents at ingest; RunEvent stays the source of truth.

The tables ingest writes at every batch (these three and RunEvent) keep no foreign key
constraint to their run (db_constraint=False): PostgreSQL checked one per row at commit,
about half of a raw COPY's time (bench/ingest.py: its COPY limit 117k -> 215k values/s,
ingest 42-45k -> 51-54k). Ingest stores rows only under the run's row lock, having found the
run there (jobs/ingest/store.py); deleting a run deletes its rows (Django's CASCADE, which
runs in Python either way).
"""

from collections.abc import Iterable, Sequence

from django.db import connection, models

from jobs import fastjson


class MetricPoint(models.Model):
    # db_index=False here and on the other ingest tables: their (run, ...) indexes lead
    # with run, and an index on run alone only cost writes (a tenth of the database's CPU
    # per ingested batch).
    run = models.ForeignKey("jobs.Run", on_delete=models.CASCADE, related_name="metric_points",
                            db_constraint=False, db_index=False)
    step = models.BigIntegerField()
    name = models.TextField()
    # NULL when the engine reported NaN or +-inf: JSON (and Postgres jsonb) cannot carry them.
    value = models.FloatField(null=True)

    class Meta:
        constraints = [
            # Also the index that loads a series: WHERE run = ? AND name = ? ORDER BY step.
            models.UniqueConstraint(fields=["run", "name", "step"], name="metric_point_unique"),
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.step} {self.name}={self.value}"


class PhaseSpan(models.Model):
    """A phase (rollout, reward, learner, weight_sync) busy on one logical device."""

    run = models.ForeignKey("jobs.Run", on_delete=models.CASCADE, related_name="phase_spans",
                            db_constraint=False, db_index=False)
    device = models.TextField()
    phase = models.TextField()
    start = models.FloatField()  # unix seconds
    end = models.FloatField()
    step = models.BigIntegerField()
    version = models.BigIntegerField()

    class Meta:
        indexes = [models.Index(fields=["run", "step"], name="phase_span_run_step")]

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.step} {self.device} {self.phase}"


def latest_values(run_ids) -> dict[int, dict[str, tuple[int, float | None]]]:
    """{run id: {metric name: (step, value)}} at each metric's last reported step: the
    API's run detail and the Prometheus scrape read the same thing. Per run, its names
    and each one's last point by index seeks (stored_metric_names, last_points: two round
    trips a run): a GROUP BY, or rows fetched by step, read every point of the run (6.4M
    at 100k steps of 64 names)."""
    out: dict[int, dict[str, tuple[int, float | None]]] = {}
    for run_id in run_ids:
        if latest := last_points(run_id, stored_metric_names(run_id)):
            out[run_id] = latest
    return out


def stored_metric_names(run_id: int) -> list[str]:
    """The run's distinct metric names (of its raw points), in the database's collation
    order (callers that show them sort them): a loose index scan,
    one seek per name on metric_point_unique (run, name, step), where DISTINCT reads every
    point of the run."""
    table = connection.ops.quote_name(MetricPoint._meta.db_table)
    first = f"SELECT name FROM {table} WHERE run_id = %s ORDER BY name LIMIT 1"
    after = (f"SELECT name FROM {table} WHERE run_id = %s AND name > names.n "
             "ORDER BY name LIMIT 1")
    with connection.cursor() as cursor:
        cursor.execute(f"WITH RECURSIVE names(n) AS (SELECT ({first}) UNION ALL "
                       f"SELECT ({after}) FROM names WHERE names.n IS NOT NULL) "
                       "SELECT n FROM names WHERE n IS NOT NULL", [run_id, run_id])
        return [name for name, in cursor.fetchall()]


def json_rows(columns: Sequence[tuple[str, str]]) -> str:
    """PostgreSQL: the table t(columns), (name, type) pairs, of one parameter, a JSON array
    of rows (fastjson.dumps of tuples). Not an array parameter per column: with
    client-side binding psycopg quotes each element of an array in Python (a few hundred
    a batch at ingest, 0.17 ms per 64 rows of three columns here), a JSON string in C
    (0.02 ms)."""
    cols = ", ".join(f"(e->>{i})::{kind} AS {name}" for i, (name, kind) in enumerate(columns))
    return f"(SELECT {cols} FROM json_array_elements(%s::json) AS e) AS t"


JSON_NAMES = "json_array_elements_text(%s::json) AS t(n)"   # json_rows of names alone


def last_points(run_id: int, names) -> dict[str, tuple[int, float | None]]:
    """{name: (its highest stored step, the value there)} of those of ``names`` stored: an
    index seek each, in one round trip (PostgreSQL: a LATERAL join over the names,
    planned once; SQLite: a UNION ALL arm per name)."""
    table = connection.ops.quote_name(MetricPoint._meta.db_table)
    names = list(names)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"SELECT t.n, x.step, x.value FROM {JSON_NAMES} CROSS JOIN "
                f"LATERAL (SELECT step, value FROM {table} WHERE run_id = %s AND name = t.n "
                "ORDER BY step DESC LIMIT 1) AS x", [fastjson.dumps(names), run_id])
            rows = cursor.fetchall()
        else:
            arm = (f"SELECT * FROM (SELECT name, step, value FROM {table} WHERE run_id = %s "
                   "AND name = %s ORDER BY step DESC LIMIT 1)")
            rows = union_all(cursor, arm, [(run_id, name) for name in names])
    return {name: (step, value) for name, step, value in rows}


def last_steps(run, names: Iterable[str]) -> dict[str, int]:
    """{name: its highest stored step} of those stored."""
    return {name: hi for name, (_, hi) in step_bounds(run, names).items()}


def step_bounds(run, names: Iterable[str],
                first: bool = False) -> dict[str, tuple[int | None, int]]:
    """{name: (its lowest stored step if ``first``, its highest)} of those stored: an
    index seek each (a GROUP BY would read every point of each), in one round trip.
    PostgreSQL: one correlated subquery over the names (JSON_NAMES); SQLite: a
    UNION ALL arm per name (it has no arrays, and plans arms cheaply)."""
    table = connection.ops.quote_name(MetricPoint._meta.db_table)
    names = list(names)

    def seek(fn: str, name_sql: str) -> str:
        return f"(SELECT {fn}(step) FROM {table} WHERE run_id = %s AND name = {name_sql})"
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            low = seek("MIN", "t.n") if first else "NULL"
            cursor.execute(f"SELECT t.n, {low}, {seek('MAX', 't.n')} FROM {JSON_NAMES}",
                           [run.pk] * first + [run.pk, fastjson.dumps(names)])
            rows = cursor.fetchall()
        else:
            low = seek("MIN", "%s") if first else "NULL"
            rows = union_all(cursor, f"SELECT %s, {low}, {seek('MAX', '%s')}",
                             [(n, *((run.pk, n) if first else ()), run.pk, n) for n in names])
    return {name: (lo, hi) for name, lo, hi in rows if hi is not None}


def union_all(cursor, arm: str, args: list[tuple]) -> list[tuple]:
    """SQLite, which has no arrays: the rows of the SELECT ``arm`` run with each of
    ``args``, as UNION ALLs of up to 200 arms (a compound SELECT takes at most 500)."""
    rows = []
    for start in range(0, len(args), 200):
        chunk = args[start:start + 200]
        cursor.execute(" UNION ALL ".join([arm] * len(chunk)), [v for a in chunk for v in a])
        rows += cursor.fetchall()
    return rows


class MetricRollup(models.Model):
    """One bucket of a metric's steps at one tier: steps [bucket * width, (bucket + 1) *
    width). Kept as points arrive (jobs/rollups.py derive_rollups), so a long run's chart
    reads a few thousand of these instead of every point, and they outlive the raw points
    (RLPLANE_RAW_POINTS_RETENTION_DAYS). ``count``, ``total``, ``low`` and ``high`` are over
    the bucket's finite values (a NaN is stored as NULL and counted nowhere); ``last`` is
    the value at the bucket's highest step, NULL included."""

    run = models.ForeignKey("jobs.Run", on_delete=models.CASCADE, related_name="metric_rollups",
                            db_constraint=False, db_index=False)
    name = models.TextField()
    width = models.IntegerField()      # steps per bucket: one of jobs.rollups.TIERS
    bucket = models.BigIntegerField()  # step // width
    count = models.IntegerField()
    total = models.FloatField()
    low = models.FloatField(null=True)
    low_step = models.BigIntegerField(null=True)
    high = models.FloatField(null=True)
    high_step = models.BigIntegerField(null=True)
    last_step = models.BigIntegerField()
    last = models.FloatField(null=True)
    ts = models.FloatField(null=True)  # unix time the bucket's latest point was reported

    class Meta:
        constraints = [
            # Also the index a chart reads: WHERE run = ? AND width = ? AND name IN (...).
            models.UniqueConstraint(fields=["run", "width", "name", "bucket"],
                                    name="metric_rollup_unique"),
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} {self.name} steps {self.bucket * self.width}+{self.width}"
