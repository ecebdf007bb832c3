"""What a run's names and latest values cost must not grow with its history: ingest checks
every batch's names (jobs/ingest/name_cap.py), the API's run detail and the Prometheus
scrape read each run's latest values, and at 100k steps of 64 names a read of every point
is 6.4M rows. Measured as the work the database does (PostgreSQL: index entries and table
rows read in this transaction; SQLite: virtual machine steps), on a run of 10 steps and
one of 2,000 with the same names."""

import contextlib

import pytest
from django.db import connection

from jobs.ingest.name_cap import within_name_cap
from jobs.models import MetricPoint, RunStatus, latest_values, stored_metric_names
from jobs.rollups import close_open_buckets, expired_runs

from .helpers import metrics

NAMES = ["a/x", "b/y", "c/z"]


def fill(run, steps):
    MetricPoint.objects.bulk_create(
        MetricPoint(run=run, step=step, name=name, value=step + k / 10)
        for step in range(steps) for k, name in enumerate(NAMES))


@contextlib.contextmanager
def database_work():
    """Yields a list that holds, after the block, the work the database did in it."""
    spent = []
    if connection.vendor == "postgresql":
        table = MetricPoint._meta.db_table
        relations = [table, *(c.name for c in MetricPoint._meta.constraints)]

        def read():
            with connection.cursor() as cursor:
                cursor.execute("SELECT sum(pg_stat_get_xact_tuples_returned(c.oid)) "
                               "FROM pg_class c WHERE c.relname = ANY(%s) OR c.oid IN "
                               "(SELECT indexrelid FROM pg_index WHERE indrelid = %s::regclass)",
                               [relations, table])
                return cursor.fetchone()[0]
        before = read()
        yield spent
        spent.append(read() - before)
        return
    connection.ensure_connection()
    steps = [0]

    def count():
        steps[0] += 1
        return 0
    connection.connection.set_progress_handler(count, 10)
    try:
        yield spent
    finally:
        connection.connection.set_progress_handler(None, 10)
    spent.append(steps[0])


def cost(fn, run):
    with database_work() as spent:
        fn(run)
    return spent[0]


READERS = {
    "the name cap's check of a batch": lambda run: within_name_cap(
        run, [metrics(1, 1, **dict.fromkeys(NAMES, 1.0))]),
    "the name cap's list of a run's names": lambda run: within_name_cap(
        run, [metrics(1, 1, **dict.fromkeys(NAMES + ["new/name"], 1.0))]),
    "latest values (run detail, Prometheus)": lambda run: latest_values([run.pk]),
    "stored metric names": lambda run: stored_metric_names(run.pk),
    "closing a finished run's buckets": close_open_buckets,
}


@pytest.mark.parametrize("reader", READERS)
def test_reading_names_and_latest_values_does_not_grow_with_the_runs_history(make_run,
                                                                              reader):
    short, long = make_run(name="short"), make_run(name="long")
    fill(short, 10)
    fill(long, 2_000)
    read = READERS[reader]

    short_cost, long_cost = cost(read, short), cost(read, long)

    # The measure sees a read of every point (PostgreSQL counts nothing with track_counts
    # off, and every reader would pass).
    assert cost(lambda run: list(MetricPoint.objects.filter(run=run).values_list("value")),
                long) > 1_000
    # A read of every point costs the long run ~200x the short one's.
    assert long_cost <= 2 * short_cost + 50, (reader, short_cost, long_cost)


def test_finding_the_runs_whose_raw_points_expired_does_not_read_their_points(make_run):
    from django.utils import timezone

    old = make_run(status=RunStatus.SUCCEEDED, finished_at=timezone.now())
    fill(old, 2_000)
    make_run(status=RunStatus.SUCCEEDED, finished_at=timezone.now(), name="no points")

    with database_work() as spent:
        found = list(expired_runs(-1))

    assert found == [old]
    assert spent[0] < 500, spent   # a join read its 6,000 points


def test_names_and_latest_values_are_what_the_points_say(make_run):
    run, other = make_run(), make_run(name="other")
    fill(run, 30)
    MetricPoint.objects.create(run=run, step=40, name="b/y", value=None)
    MetricPoint.objects.create(run=other, step=99, name="zz", value=1.0)

    assert stored_metric_names(run.pk) == NAMES
    assert stored_metric_names(make_run(name="empty").pk) == []
    assert latest_values([run.pk, other.pk]) == {
        run.pk: {"a/x": (29, 29.0), "b/y": (40, None), "c/z": (29, 29.2)},
        other.pk: {"zz": (99, 1.0)}}


def test_the_apis_series_of_a_long_range_reads_a_few_rows_a_step_range(make_run):
    from jobs.queries.history import series
    from jobs.rollups import rebuild_rollups

    short, long = make_run(name="short"), make_run(name="long")
    fill(short, 200)
    fill(long, 2_000)
    for run in (short, long):
        rebuild_rollups(run)
    read = lambda run: series(run, NAMES, 3, None, 41)  # noqa: E731

    short_cost, long_cost = cost(read, short), cost(read, long)

    # 20 step ranges a series either way: its tiers' buckets, raw points at the edges (a
    # read of every raw point costs the long run 10x).
    assert long_cost <= 2 * short_cost + 50, (short_cost, long_cost)
