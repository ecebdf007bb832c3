"""A run's metric tiers (jobs/rollups.py): kept as points arrive, equal to the aggregate of
their points, what long charts draw, and what stays once the retention drops raw points."""

import json
import math
import random
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs import rollups
from jobs.ingest.bulk import copy_rows
from jobs.ingest.store import do_ingest_events
from jobs.models import MetricPoint, MetricRollup, RunStatus
from jobs.queries import history
from jobs.queries.run_page import chart_data, runs_with_latest_metrics
from jobs.rollups import (
    TIERS,
    Bucket,
    aggregate,
    drop_expired_points,
    drop_raw_points,
    rebuild_rollups,
    upsert,
)

from .helpers import api_token, metrics

REWARD, GAP = "reward/mean", "logprob_gap/mean"


def ingest(run, steps, seq0, value=lambda s: math.sin(s / 7)):
    events = [metrics(seq0 + i, s, **{REWARD: value(s), GAP: float(s % 5)})
              for i, s in enumerate(steps)]
    do_ingest_events(run, events)
    return seq0 + len(events)


def aggregate_of_points(run, name, width, bucket):
    expected = Bucket()
    for step, value in (MetricPoint.objects.filter(
            run=run, name=name, step__gte=bucket * width, step__lt=(bucket + 1) * width)
            .order_by("step").values_list("step", "value")):
        expected.add(step, value)
    return expected


def assert_tiers_are_their_points(run):
    rows = list(MetricRollup.objects.filter(run=run))
    assert rows
    for row in rows:
        expected = aggregate_of_points(run, row.name, row.width, row.bucket)
        assert (row.count, row.low, row.low_step, row.high, row.high_step, row.last_step,
                row.last) == (expected.count, expected.low, expected.low_step, expected.high,
                              expected.high_step, expected.last_step, expected.last), row
        assert math.isclose(row.total, expected.total, abs_tol=1e-9)


def test_each_closed_bucket_is_the_aggregate_of_its_points_a_re_reported_step_included(run):
    seq = ingest(run, range(0, 7), 1)
    seq = ingest(run, range(7, 140), seq)          # closes 10-step buckets 0..12, 100's 0
    seq = ingest(run, [141, 143, 150, 151], seq)   # sparse steps close 13 and 14
    # A resumed run redoes steps 15 and 120 (closed buckets): the later value replaces
    # the stored one in the point and in every bucket holding it, NaN counted nowhere.
    seq = ingest(run, [15, 120], seq, value=lambda s: {15: 9.0, 120: float("nan")}[s])
    ingest(run, [261], seq)

    assert_tiers_are_their_points(run)
    closed = {(w, b) for w, b in MetricRollup.objects.filter(run=run, name=REWARD)
              .values_list("width", "bucket")}
    assert closed == ({(10, b) for b in range(16)} | {(50, b) for b in range(4)}
                      | {(100, 0), (100, 1)})
    hundred = MetricRollup.objects.get(run=run, name=REWARD, width=100, bucket=0)
    assert (hundred.high, hundred.high_step) == (9.0, 15)
    assert MetricRollup.objects.get(run=run, name=REWARD, width=10, bucket=12).count == 9


def test_batches_of_any_size_keep_every_tier_the_aggregate_of_its_points(run):
    """Batches ending anywhere in a bucket, steps skipped, closed steps reported again:
    each batch's buckets are folded from the finer ones it made and the stored rest."""
    rng, seq, step = random.Random(7), 1, 0
    while step < 1_200:
        size = rng.choice([1, 3, 9, 10, 37, 120, 260])
        steps = [s for s in range(step, step + size) if rng.random() > 0.1]
        if steps and rng.random() < 0.2:  # a resumed run redoes a few closed steps
            steps = sorted({*steps, *rng.sample(range(step + 1), min(3, step + 1))})
        seq = ingest(run, steps, seq, value=lambda s: rng.choice([rng.random(), float("nan")]))
        step += size
    assert_tiers_are_their_points(run)
    assert {w for w, in MetricRollup.objects.filter(run=run).values_list("width")} == {
        10, 50, 100, 500, 1_000}


def test_a_batch_closing_buckets_of_every_tier_reads_and_writes_once(run, monkeypatch):
    """Not a read and a write per tier: the points the batch does not hold, the finer rows
    its coarser buckets need that it did not make, one write of all of them (PostgreSQL:
    a COPY into the table, the batch moving forward; SQLite: one upsert)."""
    copies = []

    def copy(target, rows):
        copies.append(target)
        copy_rows(target, rows)

    monkeypatch.setattr(rollups, "copy_rows", copy)
    seq = ingest(run, range(0, 996), 1)
    copies.clear()
    with CaptureQueriesContext(connection) as queries:
        ingest(run, range(996, 1_004), seq)      # closes a bucket at 10, 50, 100, 500, 1,000
    written = [q["sql"] for q in queries.captured_queries if "metricrollup" in q["sql"]]
    points = [q["sql"] for q in queries.captured_queries
              if "metricpoint" in q["sql"] and "SELECT" in q["sql"] and "MAX" not in q["sql"]]

    assert len([q for q in written if "SELECT" in q and "INSERT" not in q]) == 1, written
    inserts = len([q for q in written if "INSERT" in q])
    if connection.vendor == "postgresql":
        assert inserts == 0 and [t.split()[0] for t in copies] == ['"jobs_metricrollup"']
    else:
        assert inserts == 1, written
    assert len(points) <= 1, points
    assert_tiers_are_their_points(run)


def test_a_step_far_ahead_closes_the_buckets_that_hold_points_not_every_one_between(
        run, monkeypatch):
    """A run token is untrusted, and a sparse metric skips steps: a batch at step 10**6
    after steps 0-2 asks for the buckets its points and the stored ones are in, not the
    ~10**5 empty ones between (a step at 10**12 made ingest build a set of 10**11)."""
    asked = []

    def close(run, wanted, *args, **kwargs):
        asked.append(sum(map(len, wanted.values())))
        real_close(run, wanted, *args, **kwargs)

    real_close = rollups.close
    monkeypatch.setattr(rollups, "close", close)
    seq = ingest(run, [0, 1, 2], 1)
    seq = ingest(run, [10**6, 10**6 + 1], seq)
    assert asked[-1] <= 2 * len(TIERS) * 3, asked   # 2 names: the stored bucket, 2 points
    ingest(run, [10**12], seq)
    assert asked[-1] <= 2 * len(TIERS) * 2, asked
    assert_tiers_are_their_points(run)
    assert set(MetricRollup.objects.filter(run=run, name=REWARD, width=10)
               .values_list("bucket", flat=True)) == {0, 10**5}


def test_a_coarser_bucket_is_stamped_no_earlier_than_the_finer_ones_it_holds(run):
    """A late event (an earlier ts) that re-reports a step of a closed 10-step bucket: that
    row keeps its later ts, and the 50-step bucket the batch closes takes it too."""
    do_ingest_events(run, [metrics(seq, seq - 1, **{REWARD: 1.0}) for seq in range(2, 14)])
    do_ingest_events(run, [metrics(1, 0, **{REWARD: 2.0})]
                     + [metrics(seq, seq - 1, **{REWARD: 1.0}) for seq in range(14, 52)])

    ts = dict(((w, b), t) for w, b, t in MetricRollup.objects.filter(run=run, bucket=0)
              .values_list("width", "bucket", "ts"))
    assert ts == {(10, 0): 1002.0, (50, 0): 1002.0}
    assert_tiers_are_their_points(run)


def test_a_buckets_aggregate_is_what_adding_its_points_in_step_order_makes():
    rng = random.Random(7)
    odd = [None, math.nan, math.inf, -math.inf, 0.0, -0.0, 1.5, 1.5, -2.0]
    for _ in range(500):
        steps = rng.sample(range(40), rng.randint(1, 12))   # any order, as a dict holds them
        points = {s: rng.choice(odd) if rng.random() < 0.4 else rng.uniform(-3, 3)
                  for s in steps}
        added = Bucket(ts=5.0)
        for step in sorted(points):
            added.add(step, points[step])

        made = aggregate(points, ts=5.0)

        assert made == added  # every field, total to the last bit
        signs = [[math.copysign(1, v) for v in (b.low, b.high) if v is not None]
                 for b in (made, added)]
        assert signs[0] == signs[1]  # -0.0 and 0.0 compare equal: the earlier one kept


def test_a_tiers_write_is_one_statement_of_the_same_text_whatever_its_row_count(run):
    """psycopg parses a statement's placeholders once per text (a short one): a text that
    grew with the rows was parsed again for every batch, the most CPU of its ingest.
    SQLite writes multi-row VALUES (no parsing of that kind): its rows are checked."""
    texts = []
    for count in (3, 700):
        buckets = {(f"m{i}", 0): aggregate({5: float(i)}) for i in range(count)}
        with CaptureQueriesContext(connection) as queries:
            upsert(run, {10: buckets})
        texts.append([q["sql"] for q in queries.captured_queries if "INSERT" in q["sql"]])

    if connection.vendor == "postgresql":
        assert len(texts[0]) == 1 and texts[0] == texts[1]
    assert MetricRollup.objects.filter(run=run, width=10).count() == 700
    assert MetricRollup.objects.get(run=run, name="m699").high == 699.0


def test_a_forward_batch_closing_buckets_that_were_written_before_replaces_them(run):
    """A run whose open buckets were closed (here: rebuilt mid-run) and that reports on:
    the buckets it closes are stored already, and the direct write (PostgreSQL's COPY,
    which a unique row refuses) gives way to the upsert, losing nothing."""
    seq = ingest(run, range(0, 25), 1)
    rebuild_rollups(run)                         # writes the open 10-step bucket 2 too
    ingest(run, range(25, 60), seq, value=lambda s: 100.0 - s)

    closed = [(10, b) for b in range(5)] + [(50, 0)]   # the ones ingest keeps by now
    for name in (REWARD, GAP):
        for width, bucket in closed:
            row = MetricRollup.objects.get(run=run, name=name, width=width, bucket=bucket)
            assert row.count == width and row.total == pytest.approx(
                aggregate_of_points(run, name, width, bucket).total)


@pytest.mark.django_db(transaction=True)
def test_a_batch_after_one_that_rolled_back_on_the_same_connection_still_closes_buckets(run):
    """The staging table a rolled-back batch made is gone with it (jobs.ingest.bulk
    remembers one only once it commits)."""
    with pytest.raises(RuntimeError), transaction.atomic():
        ingest(run, range(0, 20), 1)
        raise RuntimeError("the batch fails after its rollups were written")
    assert not MetricRollup.objects.filter(run=run).exists()

    ingest(run, range(0, 20), 1)
    ingest(run, range(20, 40), 21)

    assert MetricRollup.objects.filter(run=run, name=REWARD, width=10).count() == 3
    assert_tiers_are_their_points(run)


def test_rebuilt_tiers_equal_the_ones_kept_at_ingest(run):
    seq = ingest(run, range(0, 90), 1)
    ingest(run, range(90, 2_050, 7), seq)
    kept = {(r.name, r.width, r.bucket): (r.count, r.low, r.high, r.last)
            for r in MetricRollup.objects.filter(run=run)}

    rebuild_rollups(run)

    rebuilt = {(r.name, r.width, r.bucket): (r.count, r.low, r.high, r.last)
               for r in MetricRollup.objects.filter(run=run)}
    # The rebuild also closes each series' open buckets.
    assert {k: v for k, v in rebuilt.items() if k in kept} == kept
    assert_tiers_are_their_points(run)


def long_run(run, steps: int, spike_at: int):
    """``steps`` steps of the page's reward series (and a sparse held-out one), stored as
    ingest stores them, without going through it: bulk rows, tiers rebuilt."""
    rows = [MetricPoint(run=run, step=s, name=name, value=value)
            for s in range(steps)
            for name, value in ((REWARD, 50.0 if s == spike_at else math.sin(s / 300)),
                                ("reward/std", 0.1), (GAP, 0.01))]
    rows += [MetricPoint(run=run, step=s, name="eval/reward_mean", value=0.5)
             for s in range(0, steps, 500)]
    MetricPoint.objects.bulk_create(rows, batch_size=5_000)
    rebuild_rollups(run)


def test_a_long_runs_page_data_stays_under_its_cap_and_keeps_a_one_step_spike(operator, run):
    long_run(run, 30_000, spike_at=21_337)

    data = chart_data(run)

    assert len(json.dumps(data)) < 150_000
    reward = next(f for f in data["charts"] if f["id"] == "reward")
    assert "30,000 steps, each 500-step bucket's min and max drawn" in \
        reward["layout"]["title"]["text"]
    for figure in data["charts"]:
        for trace in figure["traces"]:
            assert len(trace["x"]) <= 2 * history.MAX_BUCKETS
    mean = reward["traces"][2]
    assert max(mean["y"]) == 50.0 and 21_000 <= mean["x"][mean["y"].index(50.0)] < 21_500
    assert mean["x"] == sorted(mean["x"])
    response = operator.get(f"/runs/{run.pk}")
    assert response.status_code == 200 and len(response.content) < 400_000


def finished(make_run, days_ago: float):
    run = make_run(RunStatus.SUCCEEDED)
    run.finished_at = timezone.now() - timedelta(days=days_ago)
    run.save(update_fields=["finished_at"])
    return run


def test_the_retention_drops_raw_points_of_runs_finished_long_ago_and_keeps_their_tiers(
        make_run, settings):
    settings.RLPLANE_RAW_POINTS_RETENTION_DAYS = 7
    old, recent, live = finished(make_run, 10), finished(make_run, 1), make_run()
    for r in (old, recent, live):
        ingest(r, range(0, 35), 1, value=lambda s: 7.0 if s == 33 else 0.0)
    before = {(r.name, r.width, r.bucket): r.count for r in MetricRollup.objects.filter(run=old)}

    dropped = drop_expired_points()

    assert dropped == {old.pk: 70}
    assert not MetricPoint.objects.filter(run=old).exists()
    assert MetricPoint.objects.filter(run=recent).count() == MetricPoint.objects.filter(
        run=live).count() == 70
    after = {(r.name, r.width, r.bucket): r.count for r in MetricRollup.objects.filter(run=old)}
    # What was closed stays; the open buckets (steps 30-34, of every tier) closed too.
    assert {k: after[k] for k in before} == before
    assert after[REWARD, 10, 3] == 5 and after[REWARD, TIERS[-1], 0] == 35
    assert drop_expired_points() == {}


def test_a_run_whose_raw_points_were_dropped_still_charts_and_lists(
        operator, make_run, settings):
    settings.RLPLANE_RAW_POINTS_RETENTION_DAYS = 7
    old = finished(make_run, 10)
    ingest(old, range(0, 35), 1, value=lambda s: 7.0 if s == 33 else float(s) / 100)
    drop_expired_points()

    page = operator.get(f"/runs/{old.pk}")

    assert page.status_code == 200
    reward = next(f for f in page.context["data"]["charts"] if f["id"] == "reward")
    mean = reward["traces"][2]
    assert max(mean["y"]) == 7.0 and min(mean["y"]) == 0.0
    listed = runs_with_latest_metrics().get(pk=old.pk)
    assert (listed.reward_mean, listed.step) == (0.34, None)


def test_the_history_command_rebuilds_runs_stored_before_tiers_and_applies_the_retention(
        make_run):
    stored_before = finished(make_run, 3)
    MetricPoint.objects.bulk_create(MetricPoint(run=stored_before, step=s, name=REWARD,
                                                value=float(s)) for s in range(25))
    out = StringIO()

    call_command("history", "--rebuild", stdout=out)
    call_command("history", "--drop", "--days", "2", stdout=out)

    assert out.getvalue() == (f"run {stored_before.pk}: tiers rebuilt\n"
                              f"run {stored_before.pk}: 25 raw points dropped\n")
    assert MetricRollup.objects.get(run=stored_before, width=100).high == 24.0
    with pytest.raises(CommandError, match="one of --rebuild or --drop"):
        call_command("history")


def test_the_api_serves_a_dropped_runs_series_from_its_buckets(make_run, settings, client):
    settings.RLPLANE_RAW_POINTS_RETENTION_DAYS = 7
    old = finished(make_run, 10)
    ingest(old, range(0, 35), 1, value=lambda s: 7.0 if s == 33 else float(s) / 100)
    drop_expired_points()
    auth = {"Authorization": f"Bearer {api_token('viewer', operator=False)}"}

    series = client.get(f"/api/v1/runs/{old.pk}/metrics", {"name": REWARD},
                        headers=auth).json()["series"]
    names = client.get(f"/api/v1/runs/{old.pk}/metric-names", headers=auth).json()["names"]

    # each bucket's low and high at their steps, then the newest point
    assert series[REWARD] == {"steps": [0, 9, 10, 19, 20, 29, 30, 33, 34],
                              "values": [0.0, 0.09, 0.1, 0.19, 0.2, 0.29, 0.3, 7.0, 0.34]}
    assert names == [GAP, REWARD]
    # a range's edges: what the buckets straddling them know in it (their low, high, last)
    assert history.series(old, [REWARD], 5, 14, 500)[REWARD] == [(9, 0.09), (10, 0.1)]
    assert history.series(old, [REWARD], 1, 8, 5)[REWARD] == []


def test_a_sparse_series_with_at_most_points_in_the_range_comes_whole(make_run):
    run = make_run()
    seq = ingest(run, [0, 1, 2, 3, 30], 1)
    ingest(run, [*range(100, 400), 10_000], seq)   # its buckets closed
    raw = dict(MetricPoint.objects.filter(run=run, name=REWARD).values_list("step", "value"))

    assert history.series(run, [REWARD], None, 30, 5)[REWARD] == [
        (s, raw[s]) for s in (0, 1, 2, 3, 30)]
    assert history.series(run, [REWARD], 100, None, 301)[REWARD] == [
        (s, raw[s]) for s in [*range(100, 400), 10_000]]


def test_a_step_range_is_null_only_where_what_it_holds_is_nan(make_run):
    run = make_run()
    # the 10-step bucket 70..79 straddles two ranges; its low and high (70, 71) are in
    # the first, its last (79) in the second, whose own points are NaN
    special = {70: 0.0, 71: 1.0, **dict.fromkeys(range(74, 80), 0.5),
               **dict.fromkeys(range(80, 123), math.nan)}
    ingest(run, range(1_000), 1, value=lambda s: special.get(s, 0.25))

    got = dict(history.series(run, [REWARD], 25, None, 41)[REWARD])

    assert got[79] == 0.5 and None not in got.values()


def test_a_range_reads_nothing_below_its_start_where_raw_points_were_dropped_before(
        make_run):
    run = make_run()
    seq = ingest(run, range(0, 3_000), 1, value=lambda s: 100.0)
    drop_raw_points(run)
    ingest(run, range(3_000, 6_000), seq, value=float)

    got = history.series(run, [REWARD], None, None, 41)[REWARD]

    assert got[0][0] >= 3_000 and max(v for _, v in got) == 5_999.0


def spiky(step):
    """A slow wave with one spike up, one down, and a stretch of NaN."""
    if 600 <= step < 800:
        return math.nan
    return {777: 50.0, 1_234: -50.0}.get(step, math.sin(step / 50))


@pytest.fixture
def spiky_run(make_run):
    """A live run of 1,500 steps of REWARD, ingested in batches as a driver sends them
    (its tiers closed as they go; the newest buckets open)."""
    run = make_run()
    seq = 1
    for first in range(0, 1_500, 100):
        seq = ingest(run, range(first, first + 100), seq, value=spiky)
    return run


@pytest.mark.parametrize("start, end, points", [(None, None, 41), (137, 1_371, 41),
                                                (3, 1_499, 500), (None, 771, 9)])
def test_a_long_range_is_each_step_ranges_low_and_high_then_the_newest_point(
        spiky_run, start, end, points):
    raw = dict(MetricPoint.objects.filter(run=spiky_run, name=REWARD)
               .values_list("step", "value"))
    lo, hi = start or 0, 1_499 if end is None else end
    in_range = {s: v for s, v in raw.items() if lo <= s <= hi}

    got = history.series(spiky_run, [REWARD, REWARD], start, end, points)[REWARD]

    steps = [s for s, _ in got]
    assert len(got) <= points and steps == sorted(set(steps))
    assert all(lo <= s <= hi and raw[s] == v for s, v in got)  # real points, in range
    finite = {s: v for s, v in in_range.items() if v is not None}
    for extreme in (max(finite, key=finite.get), min(finite, key=finite.get)):
        assert (extreme, raw[extreme]) in got  # the spikes are never thinned away
    assert got[-1] == (hi, raw[hi])           # the newest point, exactly
    groups = (points - 1) // 2
    assert len(got) >= min(groups, len(in_range))  # every step range drawn


def test_a_step_range_with_no_finite_value_is_its_last_step_with_null(spiky_run):
    got = dict(history.series(spiky_run, [REWARD], 0, 999, 9)[REWARD])

    # four step ranges of 250: 750..999 is finite from 800, 500..749 before 600
    assert None not in got.values() and max(got) == 999
    got = dict(history.series(spiky_run, [REWARD], 0, 799, 9)[REWARD])
    # four of 200: 600..799 has none
    assert got[799] is None and all(v is not None for s, v in got.items() if s != 799)
    nan = history.series(spiky_run, [REWARD], 600, 799, 7)[REWARD]
    assert len(nan) == 3 and {v for _, v in nan} == {None} and nan[-1] == (799, None)
    assert history.series(spiky_run, [REWARD, "nothing/here"], 2_000, None, 7) == {
        REWARD: [], "nothing/here": []}


def test_a_short_range_comes_exact_and_one_point_is_the_newest(spiky_run):
    raw = dict(MetricPoint.objects.filter(run=spiky_run, name=REWARD)
               .values_list("step", "value"))

    assert history.series(spiky_run, [REWARD], 1_000, 1_099, 100)[REWARD] == [
        (s, raw[s]) for s in range(1_000, 1_100)]
    assert history.series(spiky_run, [REWARD], None, 1_234, 1)[REWARD] == [(1_234, -50.0)]
