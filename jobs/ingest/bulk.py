"""A batch's rows written in bulk, without a model instance (or a quoted literal) per row.

At 100 runs reporting every step, ingest writes tens of thousands of rows a second; that
many model instances, or Django's bulk_create quoting each payload into one statement,
cost more CPU than the database spends storing them.

    PostgreSQL  rows the caller knows are new (a run moving forward: every seq and step
                past the run's highest stored ones, under its row lock) and spans, which
                have no key, are COPYed into their table directly. Others: COPY into a
                session temp table (created once per connection, emptied after each
                use), then one INSERT ... SELECT ... ON CONFLICT:
                    events          (run, seq) DO NOTHING  (the caller holds the run's
                                    row lock and stores only seqs it found new; the
                                    clause keeps a racing writer from failing the batch)
                    metric points   (run, name, step) DO UPDATE: a step reported again
                                    takes the later value
                    rollups         jobs.rollups.upsert
    others      bulk_create (SQLite: the embedded default).

Measured on the 2-core box (8,000 metric points a batch into the unique index): COPY +
upsert ~170k rows/s, INSERT ... SELECT FROM unnest(arrays) ~130k, multi-row VALUES ~80k,
and a raw COPY with no upsert ~250-320k (the limit bench/ingest.py compares against).

A staging table is per connection (a temp table): a pooler in transaction mode
(PgBouncer) that hands one session's temp table to another is not supported.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from functools import partial

from django.db import connection, transaction

from jobs import fastjson
from jobs.models import MetricPoint, PhaseSpan, RunEvent


def insert_events(run_id: int, payloads: list[dict], new: bool = False) -> None:
    """RunEvent rows of stored payloads (jobs.ingest.store.stored_payload). ``new``: each
    seq is past the run's highest stored one, the run's row locked (the job log's rows,
    written without it, have seqs below 0), so PostgreSQL COPYs them in directly."""
    if not payloads:
        return
    if connection.vendor == "postgresql" and new:
        copy_rows(f"{RunEvent._meta.db_table} (run_id, seq, type, ts, payload)",
                  ((run_id, p["seq"], p["type"], p["ts"], fastjson.dumps(p)) for p in payloads))
        return
    if connection.vendor != "postgresql":
        RunEvent.objects.bulk_create(
            [RunEvent(run_id=run_id, seq=p["seq"], type=p["type"], ts=p["ts"], payload=p)
             for p in payloads],
            ignore_conflicts=True)
        return
    copy_then_insert(
        "rlplane_event_stage", "seq bigint, type text, ts double precision, payload jsonb",
        ((p["seq"], p["type"], p["ts"], fastjson.dumps(p)) for p in payloads),
        f"INSERT INTO {RunEvent._meta.db_table} (run_id, seq, type, ts, payload) "
        "SELECT %s, seq, type, ts, payload FROM {stage} "
        "ON CONFLICT (run_id, seq) DO NOTHING", run_id)


def stored_seqs(run_id: int, seqs: list[int]) -> set[int]:
    """Those of ``seqs`` the run has stored. PostgreSQL: one array parameter, so the query's
    text is the same for any batch (psycopg caches the parsing of that one only)."""
    if not seqs:
        return set()
    if connection.vendor != "postgresql":
        return set(RunEvent.objects.filter(run_id=run_id, seq__in=seqs)
                   .values_list("seq", flat=True))
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT seq FROM {RunEvent._meta.db_table} "
                       "WHERE run_id = %s AND seq = ANY(%s::bigint[])", [run_id, seqs])
        return {seq for seq, in cursor.fetchall()}


def upsert_metric_points(run_id: int, points: dict[tuple[str, int], float | None],
                         new: bool = False) -> None:
    """Store ``{(name, step): value}`` for the run, each pair once (so that one statement
    never updates a row twice), inside the caller's transaction. ``new``: the caller
    knows no pair is stored yet (each step past its name's highest stored one, the run's
    row locked), so PostgreSQL COPYs them into the table directly, which costs the
    database about half of the upsert through a staging table."""
    if not points:
        return
    if connection.vendor == "postgresql" and new:
        copy_rows(f"{MetricPoint._meta.db_table} (run_id, step, name, value)",
                  ((run_id, step, name, value) for (name, step), value in points.items()))
        return
    if connection.vendor != "postgresql":
        MetricPoint.objects.bulk_create(
            [MetricPoint(run_id=run_id, step=step, name=name, value=value)
             for (name, step), value in points.items()],
            update_conflicts=True, unique_fields=["run", "name", "step"],
            update_fields=["value"])
        return
    copy_then_insert(
        "rlplane_metric_stage", "step bigint, name text, value double precision",
        ((step, name, value) for (name, step), value in points.items()),
        f"INSERT INTO {MetricPoint._meta.db_table} (run_id, step, name, value) "
        "SELECT %s, step, name, value FROM {stage} "
        "ON CONFLICT (run_id, name, step) DO UPDATE SET value = EXCLUDED.value", run_id)


SPAN_FIELDS = ("device", "phase", "start", "end", "step", "version")


def insert_spans(run_id: int, spans: list[tuple]) -> None:
    """PhaseSpan rows of ``spans``, tuples of SPAN_FIELDS."""
    if not spans:
        return
    if connection.vendor != "postgresql":
        PhaseSpan.objects.bulk_create(
            PhaseSpan(run_id=run_id, **dict(zip(SPAN_FIELDS, s, strict=True))) for s in spans)
        return
    copy_rows(f'{PhaseSpan._meta.db_table} (run_id, device, phase, start, "end", step, version)',
              ((run_id, *s) for s in spans))


def copy_rows(target: str, rows: Iterable[tuple]) -> None:
    """COPY ``rows`` into ``target`` ("table (columns)"), inside the caller's transaction."""
    with connection.cursor() as cursor, cursor.cursor.copy(f"COPY {target} FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


# The staging tables each connection (psycopg's) has: a temp table lives as long as its
# session, but one made in a transaction that rolled back is gone, so it is remembered
# once that commits. Saves a round trip each use (the ingest threads keep their
# connections).
STAGED: weakref.WeakKeyDictionary[object, set[str]] = weakref.WeakKeyDictionary()


def copy_then_insert(stage: str, columns: str, rows: Iterable[tuple], insert: str,
                     run_id: int) -> None:
    """COPY ``rows`` into the temp table ``stage``, then run ``insert`` (its {stage} named,
    its one parameter the run id), inside the caller's transaction."""
    with connection.cursor() as cursor:
        made = STAGED.setdefault(connection.connection, set())
        if stage not in made:
            cursor.execute(f"CREATE TEMP TABLE IF NOT EXISTS {stage} ({columns}) "
                           "ON COMMIT DELETE ROWS")
            transaction.on_commit(partial(made.add, stage))
        copy_rows(stage, rows)
        # Then emptied, in the same round trip (client-side binding sends both as one
        # simple query): a second use in the same transaction (the next rollup tier,
        # reconcile, an outer atomic) starts empty. DELETE, not TRUNCATE: that gives the
        # table a new file each time (catalog churn).
        cursor.execute(insert.format(stage=stage) + f"; DELETE FROM {stage}", [run_id])
