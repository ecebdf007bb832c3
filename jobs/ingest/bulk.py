"""A batch's metric points written in bulk, without a model instance per point.

At 100 runs reporting every step, ingest writes tens of thousands of points a second;
that many MetricPoint instances cost more CPU than the database spends storing them.

    PostgreSQL  COPY the points into a session temp table (created once per connection,
                emptied at each commit), then one INSERT ... SELECT ... ON CONFLICT
                (run, name, step) DO UPDATE: a (name, step) reported again takes the
                later value.
    others      bulk_create(update_conflicts=True) (SQLite: the embedded default).

Measured on the 2-core box (8,000-row batches into the unique index): COPY + upsert
~170k rows/s, INSERT ... SELECT FROM unnest(arrays) ~130k, multi-row VALUES ~80k, and a
raw COPY with no upsert ~250-320k (the limit bench/ingest.py compares against).

The staging table is per connection (a temp table): a pooler in transaction mode
(PgBouncer) that hands one session's temp table to another is not supported.
"""

from __future__ import annotations

from django.db import connection

from jobs.models import MetricPoint

STAGE = "rlplane_metric_stage"


def upsert_metric_points(run_id: int, points: dict[tuple[str, int], float | None]) -> None:
    """Store ``{(name, step): value}`` for the run, each pair once (so that one statement
    never updates a row twice), inside the caller's transaction."""
    if not points:
        return
    if connection.vendor != "postgresql":
        MetricPoint.objects.bulk_create(
            [MetricPoint(run_id=run_id, step=step, name=name, value=value)
             for (name, step), value in points.items()],
            update_conflicts=True, unique_fields=["run", "name", "step"],
            update_fields=["value"])
        return
    table = MetricPoint._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TEMP TABLE IF NOT EXISTS {STAGE} "
                       "(step bigint, name text, value double precision) ON COMMIT DELETE ROWS")
        with cursor.cursor.copy(f"COPY {STAGE} (step, name, value) FROM STDIN") as copy:
            for (name, step), value in points.items():
                copy.write_row((step, name, value))
        cursor.execute(
            f"INSERT INTO {table} (run_id, step, name, value) "
            f"SELECT %s, step, name, value FROM {STAGE} "
            "ON CONFLICT (run_id, name, step) DO UPDATE SET value = EXCLUDED.value",
            [run_id])
        # A second batch in the same transaction (reconcile, an outer atomic) starts empty.
        # DELETE, not TRUNCATE: that gives the table a new file each time (catalog churn).
        cursor.execute(f"DELETE FROM {STAGE}")
