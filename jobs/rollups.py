"""A run's metric history in tiers: each metric's steps in buckets of 10, 50, 100, 500,
1,000, 5,000 and 10,000 steps (count, sum, min and max with their steps, last), so a
chart of a 100k-step run reads 200 rows per series instead of 100k, and a finished run's
raw points can be dropped while its charts still draw (jobs/queries/history.py reads
them).

    ingest (in its transaction, the run's row locked), before the batch's points are
    upserted:
        derive_rollups(run, points, stored, ts)
            per metric, the highest step stored (last_steps: one index seek each, one
            query, which ingest also reads to know whether the points are all new) says
            which buckets the batch completes; only those are written, once:
            10-step buckets from their points (the stored ones, the batch's over them),
            each coarser tier from the finer one's. The open bucket of each metric
            stays in raw points until a later step closes it. A batch that re-reports a
            stored step (a resumed run) has that step's closed buckets recomputed.
    retention (Celery beat hourly: drop_expired_points; `manage.py history --drop`):
        drop_raw_points(run)   a finished run: its open buckets closed, its points deleted
    rebuild_rollups(run)       the tiers again from raw points (runs stored before tiers
                               existed; `manage.py history --rebuild`)

Cost per metric value at ingest: its row read back at most once (when its 10-step bucket
closes in a later batch than its own), and a row written per 10, 50, 100, ... 10,000
steps; per batch, one query (an index seek per metric) for their highest stored steps,
one for the stored points of the buckets it closes, one for the stored finer rows its
coarser buckets fold in, and one write of every tier's buckets. PostgreSQL: a batch moving
forward COPYs its buckets into the table (upsert's ``new``); others COPY into a staging
table, then one INSERT ... SELECT, whose text is the same whatever the row count: a
multi-row VALUES of 13 placeholders a row is never cached by psycopg, whose parsing of it
cost more CPU than the database spent storing the rows. What a bucket holds is exactly
the aggregate of its points (tests/jobs/test_rollups.py).
"""

from __future__ import annotations

import itertools
import math
import operator
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import reduce

from celery import shared_task
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from jobs import fastjson
from jobs.ingest.bulk import copy_rows, copy_then_insert
from jobs.models import (
    TERMINAL,
    MetricPoint,
    MetricRollup,
    Run,
    RunEvent,
    last_steps,
    stored_metric_names,
)
from jobs.models.series import json_rows, union_all

# Steps per bucket, finest first; each divides the next (x5, x2), so a chart finds a tier
# within 2.5x of the buckets it wants at any length.
TIERS = (10, 50, 100, 500, 1_000, 5_000, 10_000)
FINEST = TIERS[0]


@dataclass
class Bucket:
    """The aggregate of one (name, width, bucket)'s points."""

    count: int = 0
    total: float = 0.0
    low: float | None = None
    low_step: int | None = None
    high: float | None = None
    high_step: int | None = None
    last_step: int = -1
    last: float | None = None
    ts: float | None = None

    def add(self, step: int, value: float | None) -> None:
        if step >= self.last_step:
            self.last_step, self.last = step, value
        if value is None or not math.isfinite(value):
            return
        self.count += 1
        self.total += value
        if self.low is None or value < self.low:
            self.low, self.low_step = value, step
        if self.high is None or value > self.high:
            self.high, self.high_step = value, step

    def merge(self, o) -> None:
        """Fold in a finer bucket (a Bucket or a MetricRollup row) of the same steps."""
        self.count += o.count
        self.total += o.total
        # Ties go to the earlier step, as add() keeps them, whatever order rows come in.
        if o.low is not None and (self.low is None or (o.low, o.low_step) < (self.low,
                                                                           self.low_step)):
            self.low, self.low_step = o.low, o.low_step
        if o.high is not None and (self.high is None or (-o.high, o.high_step) < (
                -self.high, self.high_step)):
            self.high, self.high_step = o.high, o.high_step
        if o.last_step >= self.last_step:
            self.last_step, self.last = o.last_step, o.last
        if o.ts is not None and (self.ts is None or o.ts > self.ts):
            self.ts = o.ts


def aggregate(points: dict[int, float | None], ts: float | None = None) -> Bucket:
    """The Bucket of ``{step: value}``: what add() in step order makes of them, in loops
    that run in C (ingest closes a few hundred 10-step buckets a batch)."""
    steps = sorted(points)
    values = [points[s] for s in steps]
    bucket = Bucket(last_step=steps[-1], last=values[-1], ts=ts)
    if None in values or not all(map(math.isfinite, values)):
        kept = [(s, v) for s, v in zip(steps, values, strict=True)
                if v is not None and math.isfinite(v)]
        if not kept:
            return bucket
        steps, values = [s for s, _ in kept], [v for _, v in kept]
    bucket.count = len(values)
    bucket.total = reduce(operator.add, values, 0.0)  # add()'s order, to the last bit
    # min/max return the first of equal values, and index() its place: the earliest step,
    # as add() keeps ties.
    bucket.low, bucket.high = min(values), max(values)
    bucket.low_step = steps[values.index(bucket.low)]
    bucket.high_step = steps[values.index(bucket.high)]
    return bucket


Wanted = dict[int, set[tuple[str, int]]]  # width -> {(name, bucket)}
Series = dict[str, dict[int, float | None]]  # name -> {step: value}


def derive_rollups(run: Run, batch: dict[tuple[str, int], float | None],
                   stored: dict[str, int], ts: float | None) -> None:
    """Close the buckets that the newly stored points ``{(name, step): value}`` complete,
    ``stored`` each name's highest step stored before them (last_steps), ``ts`` their
    earliest event's time. Call before the points are upserted (the batch's values are
    laid over the stored points)."""
    if not batch:
        return
    series: Series = defaultdict(dict)
    for (name, step), value in batch.items():
        series[name][step] = value
    wanted: Wanted = {width: set() for width in TIERS}
    forward = True  # every step past its name's highest stored one
    for name, new in series.items():
        before, low, high = stored.get(name), min(new), max(new)
        again = before is not None and low <= before  # re-reported steps
        forward = forward and not again
        top = high if before is None else max(high, before)
        start = low if before is None else before
        for width in TIERS:
            closed = top // width  # buckets below it are complete
            if closed - start // width > len(new):
                # A gap (a sparse metric, a step far ahead: a run token's steps are
                # untrusted): the buckets that hold a point, its highest stored one's and
                # the batch's, not every one between, which hold nothing to write.
                held = {s // width for s in new}
                if before is not None:
                    held.add(before // width)
                wanted[width].update((name, b) for b in held if b < closed)
                continue
            wanted[width].update(zip(itertools.repeat(name), range(start // width, closed)))
            if again:  # re-reported steps of closed buckets
                wanted[width].update((name, s // width) for s in new
                                     if s <= before and s // width < closed)
    close(run, wanted, series, stored, ts, new=forward)


def close(run: Run, wanted: Wanted, batch: Series, stored: dict[str, int],
          ts: float | None, new: bool = False) -> None:
    """Write the ``wanted`` buckets of every tier, stamped ``ts`` (when they were closed:
    the wall clock the charts use), in one statement. The 10-step ones from their points
    (finest_buckets); each coarser one folded from the finer buckets made here and the
    finer rows stored before for the rest of its steps (one read for every tier). A
    finer bucket made again (a re-reported step) gives its coarser one the
    later of its stored ts and ``ts``, as its own row keeps (upsert). ``new``: the batch
    only moves forward, so no bucket it closes was written (upsert's ``new``)."""
    made = {FINEST: finest_buckets(run, wanted.get(FINEST, set()), batch, stored, ts)}
    kept: dict[int, list[RollupRow]] = defaultdict(list)
    for row in rollup_rows(run, EACH, {
            (n, finer, b * (width // finer), (b + 1) * (width // finer))
            for finer, width in itertools.pairwise(TIERS) for n, b in wanted.get(width, ())}):
        kept[row.width].append(row)
    for finer, width in itertools.pairwise(TIERS):
        ratio, wants = width // finer, wanted.get(width, set())
        buckets = made[width] = {}
        for (n, b), bucket in made[finer].items():
            if (n, b // ratio) in wants:
                buckets.setdefault((n, b // ratio), Bucket()).merge(bucket)
        for row in kept[finer]:
            coarser = buckets.setdefault((row.name, row.bucket // ratio), Bucket())
            if (row.name, row.bucket) in made[finer]:
                coarser.merge(Bucket(ts=row.ts))   # made again: only its stored ts counts
            else:
                coarser.merge(row)
    upsert(run, made, new=new)


def finest_buckets(run: Run, keys: set[tuple[str, int]], batch: Series,
                   stored: dict[str, int], ts: float | None) -> dict[tuple[str, int], Bucket]:
    """The 10-step ``keys`` from their stored points (a name's lie at or below ``stored``,
    its highest stored step: only those are read back) with ``batch``'s over them."""
    points: dict[tuple[str, int], dict[int, float | None]] = defaultdict(dict)
    for n, s, v in point_ranges(run, {
            (n, b * FINEST, min((b + 1) * FINEST, stored[n] + 1))
            for n, b in keys if n in stored and b * FINEST <= stored[n]}):
        points[n, s // FINEST][s] = v
    for n, b in keys:
        if of := batch.get(n):   # a bucket's ten steps looked up, not every point's key made
            points[n, b].update({s: of[s] for s in range(b * FINEST, (b + 1) * FINEST)
                                 if s in of})
    return {key: aggregate(of, ts) for key, of in points.items() if of}


ROLLUP_FIELDS = ("name", "width", "bucket", "count", "total", "low", "low_step", "high",
                 "high_step", "last_step", "last", "ts")


@dataclass
class RollupRow:
    name: str
    width: int
    bucket: int
    count: int
    total: float
    low: float | None
    low_step: int | None
    high: float | None
    high_step: int | None
    last_step: int
    last: float | None
    ts: float | None


EACH = "each"  # ranges(width=EACH): each span names its own width


def ranges(model, fields: Sequence[str], run: Run, width: int | str | None, field: str,
           spans: Iterable[tuple], limit: int | None = None):
    """``fields`` of ``model``'s rows of the run (and width) with name = n and
    lo <= ``field`` < hi, for each (n, lo, hi) (``width=EACH``: each (n, width, lo, hi)):
    one index range each (with ``limit``, its first ``limit`` rows by ``field``).
    PostgreSQL: a LATERAL join over the spans (json_rows) (a UNION ALL arm per span
    cost ~1 ms of planning each); OFFSET 0 keeps the subquery a parameterized index scan
    per span (pulled up into a join, it was hashed against every point of the run).
    SQLite: a UNION ALL arm per span."""
    table = connection.ops.quote_name(model._meta.db_table)
    q = connection.ops.quote_name
    cols = ", ".join(map(q, fields))
    each = width == EACH
    where = "run_id = %s" + ("" if width is None else " AND width = %s")
    head = [run.pk] if width is None or each else [run.pk, width]
    spans = sorted(spans)
    if not spans:
        return
    first = "" if limit is None else f" ORDER BY {q(field)} LIMIT %s"
    tail = [] if limit is None else [limit]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            columns = [("n", "text"), *([("w", "integer")] if each else []),
                       ("lo", "bigint"), ("hi", "bigint")]
            match = where.replace("width = %s", "width = t.w") if each else where
            cursor.execute(
                f"SELECT x.* FROM {json_rows(columns)} CROSS JOIN LATERAL (SELECT {cols} "
                f"FROM {table} WHERE {match} "
                f"AND name = t.n AND {q(field)} >= t.lo AND {q(field)} < t.hi{first} "
                f"OFFSET 0) AS x",
                [fastjson.dumps(spans), *head, *tail])
            yield from cursor.fetchall()
            return
        arm = (f"SELECT * FROM (SELECT {cols} FROM {table} WHERE {where} AND name = %s "
               f"AND {q(field)} >= %s AND {q(field)} < %s{first})")
        # each: (n, w, lo, hi) binds as width = w AND name = n ...
        yield from union_all(cursor, arm, [
            (*head, span[1], span[0], *span[2:], *tail) if each else (*head, *span, *tail)
            for span in spans])


def point_ranges(run: Run, spans: Iterable[tuple[str, int, int]], limit: int | None = None):
    """(name, step, value) of the run's raw points with name = n and lo <= step < hi, for
    each (n, lo, hi) (``ranges``)."""
    return ranges(MetricPoint, ("name", "step", "value"), run, None, "step", spans, limit)


def rollup_rows(run: Run, width: int | str, spans: set[tuple]):
    """The stored rows of ``spans`` (``ranges``: (name, lo, hi) bucket ranges at
    ``width``, or with ``EACH`` (name, width, lo, hi))."""
    return (RollupRow(*row) for row in ranges(MetricRollup, ROLLUP_FIELDS, run, width,
                                              "bucket", spans))


COLUMNS = ("run_id", "name", "width", "bucket", "count", "total", "low", "low_step", "high",
           "high_step", "last_step", "last", "ts")
STAGE_COLUMNS = ("name text, width integer, bucket bigint, count integer, "
                 "total double precision, low double precision, low_step bigint, "
                 "high double precision, high_step bigint, last_step bigint, "
                 "last double precision, ts double precision")
UPSERT_ROWS = 500  # SQLite: rows per INSERT, under its 32,766 bound parameters at 13 each


def upsert(run: Run, tiers: dict[int, dict[tuple[str, int], Bucket]],
           new: bool = False) -> None:
    """INSERT ... ON CONFLICT DO UPDATE: ``{width: {(name, bucket): Bucket}}`` in place of
    what was stored, keeping the later ts, every tier in one statement. PostgreSQL: their
    rows COPYed into a staging table first (jobs.ingest.bulk), so the statement's text
    never changes; SQLite: multi-row VALUES.

    ``new`` (PostgreSQL): the caller expects none of the rows to be stored (a run moving
    forward closes buckets no batch closed before), so they are COPYed into the table
    directly, which costs the database about half of the staged upsert; in a savepoint,
    since a run whose open buckets were closed (retention, ``history --rebuild``) and
    that reports again does hold some: then the staged upsert after all."""
    rows = [(name, width, b, k.count, k.total, k.low, k.low_step, k.high, k.high_step,
             k.last_step, k.last, k.ts)
            for width, buckets in tiers.items() for (name, b), k in buckets.items()]
    if not rows:
        return
    postgres = connection.vendor == "postgresql"
    table = connection.ops.quote_name(MetricRollup._meta.db_table)
    q = connection.ops.quote_name
    if postgres and new:
        try:
            with transaction.atomic():
                copy_rows(f"{table} ({', '.join(map(q, COLUMNS))})",
                          ((run.pk, *row) for row in rows))
            return
        except connection.Database.IntegrityError:
            pass  # rolled back to the savepoint: upsert them
    sets = [f"{q(c)} = excluded.{q(c)}" for c in COLUMNS[4:-1]]
    sets.append(f"{q('ts')} = {'GREATEST' if postgres else 'MAX'}("
                f"COALESCE({table}.ts, excluded.ts), COALESCE(excluded.ts, {table}.ts))")
    on_conflict = (f"ON CONFLICT ({q('run_id')}, {q('width')}, {q('name')}, {q('bucket')}) "
                   "DO UPDATE SET " + ", ".join(sets))
    insert = f"INSERT INTO {table} ({', '.join(map(q, COLUMNS))}) "
    if postgres:
        copy_then_insert("rlplane_rollup_stage", STAGE_COLUMNS, rows,
                         insert + f"SELECT %s, {', '.join(map(q, COLUMNS[1:]))} FROM {{stage}} "
                         + on_conflict, run.pk)
        return
    one = "(" + ", ".join(["%s"] * len(COLUMNS)) + ")"
    with connection.cursor() as cursor:
        for start in range(0, len(rows), UPSERT_ROWS):
            chunk = rows[start:start + UPSERT_ROWS]
            cursor.execute(insert + f"VALUES {', '.join([one] * len(chunk))} " + on_conflict,
                           [v for row in chunk for v in (run.pk, *row)])


def last_metrics_ts(run: Run) -> float | None:
    return (RunEvent.objects.filter(run=run, type="metrics.append").order_by("-seq")
            .values_list("ts", flat=True).first())


def close_open_buckets(run: Run) -> None:
    """Close every metric's open bucket at every tier (the run will report no more)."""
    last = last_steps(run, stored_metric_names(run.pk))
    close(run, {width: {(n, s // width) for n, s in last.items()} for width in TIERS},
          {}, last, last_metrics_ts(run))


def rebuild_rollups(run: Run) -> None:
    """The run's tiers again from its raw points, every bucket closed (no wall times:
    the points keep none). One pass over the points in the unique index's order."""
    with transaction.atomic():
        MetricRollup.objects.filter(run=run).delete()
        tiers: dict[int, dict[tuple[str, int], Bucket]] = {width: {} for width in TIERS}
        rows = (MetricPoint.objects.filter(run=run).order_by("name", "step")
                .values_list("name", "step", "value").iterator(chunk_size=20_000))
        for name, step, value in rows:
            for width, buckets in tiers.items():
                key = (name, step // width)
                bucket = buckets.get(key)
                if bucket is None:
                    bucket = buckets[key] = Bucket()
                bucket.add(step, value)
        upsert(run, tiers)


def drop_raw_points(run: Run) -> int:
    """Delete a finished run's raw points, its tiers closed first; the number deleted."""
    with transaction.atomic():
        if not MetricRollup.objects.filter(run=run).exists():
            rebuild_rollups(run)  # stored before tiers existed
        else:
            close_open_buckets(run)
        deleted, _ = MetricPoint.objects.filter(run=run).delete()
    return deleted


def expired_runs(days: float):
    """Finished runs that finished more than ``days`` ago and still hold raw points."""
    cutoff = timezone.now() - timedelta(days=days)
    # EXISTS: a seek per run (a join read every point of every such run, then DISTINCT).
    return Run.objects.filter(Exists(MetricPoint.objects.filter(run=OuterRef("pk"))),
                              status__in=list(TERMINAL), finished_at__lt=cutoff)


@shared_task
def drop_expired_points(days: float | None = None) -> dict[int, int]:
    """The retention: {run id: raw points deleted} of every run past
    RLPLANE_RAW_POINTS_RETENTION_DAYS (unset or 0: raw points are kept forever)."""
    days = settings.RLPLANE_RAW_POINTS_RETENTION_DAYS if days is None else days
    if not days:
        return {}
    return {run.pk: drop_raw_points(run) for run in expired_runs(days)}
