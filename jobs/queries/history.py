"""What a chart reads of a run's series: its raw points while the run spans at most
RAW_SPAN steps, else the finest tier (jobs/rollups.py) with at most MAX_BUCKETS buckets
over the run, so no series ships more than ~2 x MAX_BUCKETS points (and its open
buckets' points) at any length:

    history = load(run, names)
        .steps   [(x, {name: value})] in x order: what charts.metric_figures draws
        .width   steps per bucket drawn (None: raw points)
        .times   {x: unix time} where known (raw: when the step was reported; a bucket's
                 two points: between its closing and the previous one's)
        .steps_reported   the most steps any of ``names`` reported

    series(run, names, start, end, points)   what the API serves of a step range: its raw
        points where they are at most ``points``, else each of (points - 1) // 2 step
        ranges' low and high, folded from the tiers' buckets inside it (``series``)

A bucket is drawn as two points, its lowest and its highest value in the order they
came, at a quarter and three quarters of its steps: a one-step spike stays on the chart.
Each series draws its closed buckets of the chosen width, then where it has gone past
them (its open bucket) the finer tiers' closed buckets, then its raw points: the newest
steps are always exact, and live points extend them.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.db.models import Max, Min

from jobs.models import MetricPoint, MetricRollup, Run, RunEvent, step_bounds
from jobs.rollups import FINEST, TIERS, Bucket, RollupRow, point_ranges, ranges, rollup_rows

RAW_SPAN = 500     # a run over at most this many steps draws every point
MAX_BUCKETS = 250  # else the finest tier with at most this many buckets over the run:
# 30 series of 2 x 250 points are ~350 kB of JSON
ENDLESS = 2**62     # a range's upper bound: to the series' end


@dataclass
class History:
    steps: list[tuple[int, dict]]
    width: int | None
    times: dict[int, float] = field(default_factory=dict)
    steps_reported: int = 0


def extent(run: Run, names: list[str]) -> tuple[int, int] | None:
    """(first, last) step of ``names``' raw points: two index seeks per name."""
    bounds = step_bounds(run, names, first=True).values()
    if not bounds:
        return None
    return min(lo for lo, _ in bounds), max(hi for _, hi in bounds)


def tier_extent(run: Run, names: list[str]) -> tuple[int, int] | None:
    """(first, last) step the coarsest tier holds of ``names`` (raw points dropped)."""
    got = MetricRollup.objects.filter(run=run, width=TIERS[-1], name__in=names).aggregate(
        lo=Min("bucket"), hi=Max("last_step"))
    return None if got["lo"] is None else (got["lo"] * TIERS[-1], got["hi"])


def width_for(first: int, last: int) -> int:
    span = last - first + 1
    return next((w for w in TIERS if span / w <= MAX_BUCKETS), TIERS[-1])


def load(run: Run, names: Iterable[str]) -> History:
    names = sorted(set(names))
    raw = extent(run, names) if names else None
    if raw is not None and raw[1] - raw[0] < RAW_SPAN:
        return raw_history(run, names)
    # A seek per name on the unique index's (run, width, name) prefix: as one query with
    # name IN (...), PostgreSQL filtered the run's rows of every tier by width and name
    # (its run_id index), and read all of them when none matched: 39 ms at 100k steps.
    has_tiers = any(ranges(MetricRollup, ("bucket",), run, TIERS[0], "bucket",
                           [(n, -ENDLESS, ENDLESS) for n in names], limit=1))
    if raw is not None and not has_tiers:
        return raw_history(run, names)  # stored before tiers existed (manage.py history)
    span = raw or (tier_extent(run, names) if has_tiers else None)
    if span is None:
        return History([], None)
    return tiered_history(run, names, width_for(*span))


def raw_history(run: Run, names: list[str]) -> History:
    rows = (MetricPoint.objects.filter(run=run, name__in=names).order_by("name", "step")
            .values_list("step", "name", "value"))
    steps: dict[int, dict] = {}
    counts: dict[str, int] = defaultdict(int)
    for step, name, value in rows:
        steps.setdefault(step, {})[name] = value
        counts[name] += 1
    times = dict(RunEvent.objects.filter(run=run, type="metrics.append").order_by("seq")
                 .values_list("payload__step", "ts"))
    return History(sorted(steps.items()), None, {s: t for s, t in times.items() if s in steps},
                   max(counts.values(), default=0))


def tiered_history(run: Run, names: list[str], width: int) -> History:
    steps: dict[int, dict] = defaultdict(dict)
    ends: dict[int, float] = {}   # a bucket's last step + 1 -> when it closed
    covered = {name: 0 for name in names}  # per series: steps below this are drawn
    counts: dict[str, int] = defaultdict(int)
    fields = ("name", "bucket", "count", "low", "low_step", "high", "high_step", "ts")
    for tier in reversed([w for w in TIERS if w <= width]):
        if tier == width:
            rows = MetricRollup.objects.filter(run=run, width=tier, name__in=names).order_by(
                ).values_list(*fields)
        else:  # each series' open bucket of the coarser tiers, from this finer one
            rows = ranges(MetricRollup, fields, run, tier, "bucket",
                          [(n, c // tier, ENDLESS) for n, c in covered.items()])
        reached = {}
        for name, bucket, count, low, low_step, high, high_step, ts in rows:
            start = bucket * tier
            if start < covered[name]:
                continue
            if count:  # its low and high, in the order its steps reached them
                first, second = (low, high) if low_step <= high_step else (high, low)
                steps[start + tier // 4][name] = first
                steps[start + (3 * tier) // 4][name] = second
            counts[name] += count
            reached[name] = max(reached.get(name, 0), start + tier)
            if ts is not None:
                ends[start + tier] = max(ends.get(start + tier, ts), ts)
        covered.update(reached)
    tail_steps = set()
    for name, step, value in point_ranges(run, [(n, c, ENDLESS) for n, c in covered.items()]):
        steps[step][name] = value
        counts[name] += 1
        tail_steps.add(step)
    times = bucket_times(steps, ends)
    if tail_steps:
        recent = (RunEvent.objects.filter(run=run, type="metrics.append").order_by("-seq")
                  .values_list("payload__step", "ts")[:4 * len(tail_steps) + 100])
        times.update((s, t) for s, t in recent if s in tail_steps and s not in times)
    return History(sorted(steps.items()), width, times, max(counts.values(), default=0))


def bucket_times(steps: dict[int, dict], ends: dict[int, float]) -> dict[int, float]:
    """A drawn x's time, between the closing times of the buckets around it."""
    if not ends:
        return {}
    edges = sorted(ends)
    out = {}
    for x in steps:
        i = bisect.bisect_right(edges, x)
        if i == len(edges):
            continue
        hi_x, hi_t = edges[i], ends[edges[i]]
        lo_x, lo_t = (edges[i - 1], ends[edges[i - 1]]) if i else (hi_x, hi_t)
        out[x] = hi_t if hi_x == lo_x else lo_t + (hi_t - lo_t) * (x - lo_x) / (hi_x - lo_x)
    return out


def times_at(times: dict[int, float], steps: Iterable[int]) -> dict[int, float]:
    """Each of ``steps`` not in ``times``, at the time between the known ones around it
    (a mark's step on a chart drawn from buckets)."""
    known = sorted(times.items())
    xs = [x for x, _ in known]
    out = {}
    for step in steps:
        if step in times or not known:
            continue
        i = bisect.bisect_left(xs, step)
        if 0 < i < len(xs):
            (x0, t0), (x1, t1) = known[i - 1], known[i]
            out[step] = t0 + (t1 - t0) * (step - x0) / (x1 - x0)
    return out


def series(run: Run, names: list[str], start: int | None, end: int | None,
           points: int) -> dict[str, list[tuple[int, float | None]]]:
    """{name: [(step, value)]} of ``start``..``end`` (default: the whole series), at most
    ``points`` per series: what the API serves (GET /api/v1/runs/<id>/metrics).

    A series with at most ``points`` raw points in the range comes whole, exact (a read of
    at most points + 1 rows tells). A longer one comes as (points - 1) // 2 equal step
    ranges, each as its lowest and highest value at their steps (one point where they are
    one step; a step of it with null where it has no finite value), then the newest point
    of the range: a one-step spike is never thinned away. They are folded from the tiers'
    closed buckets inside the range and the raw points between them (``cover``), so a
    read costs a few rows per step range whatever the run's length. A bucket's low, high
    and last count in the step range of their own steps (a bucket that straddles two
    ranges gives each what it knows of it: where that is only NaN, the range is null).
    A series whose raw points were dropped has only its buckets: at the range's edges,
    the points they know in it (their low, high and last)."""
    names = list(dict.fromkeys(names))
    out: dict[str, list] = {name: [] for name in names}
    wanted = {}
    for name, (first, last, raw) in extents(run, names).items():
        lo = first if start is None else max(start, first)
        hi = last if end is None else min(end, last)
        if lo <= hi:
            wanted[name] = (raw, lo, hi)
    probe: dict[str, list] = defaultdict(list)
    for name, step, value in point_ranges(run, [(n, lo, hi + 1) for n, (raw, lo, hi)
                                                in wanted.items() if raw], limit=points + 1):
        probe[name].append((step, value))
    groups = (points - 1) // 2
    plans = {}
    for name, (raw, lo, hi) in wanted.items():
        if raw and len(probe[name]) <= points:
            out[name] = sorted(probe[name])  # every raw point of the range: exact
            continue
        # The coarsest tier of at least one bucket a range: at most 5 rows a range (the
        # tiers are x5 or x2 apart), or raw points where a range is under 10 steps. (No
        # range, points < 3: only the newest point, from the coarsest tier.)
        top = next((w for w in reversed(TIERS) if w * groups <= hi - lo + 1),
                   None if raw else TIERS[0])
        plans[name] = (top, lo, hi + 1, raw)
    for name, pieces in cover(run, plans).items():
        _, lo, hi = wanted[name]
        out[name] = fold(pieces, lo, hi, groups)
    return out


def extents(run: Run, names: list[str]) -> dict[str, tuple[int, int, bool]]:
    """{name: (first, last step, True)} of its raw points (two index seeks), else (raw
    points dropped) {name: (first, last step, False)} of its finest tier's buckets."""
    bounds = {name: (lo, hi, True)
              for name, (lo, hi) in step_bounds(run, names, first=True).items()}
    missing = [n for n in names if n not in bounds]
    if missing:
        rows = (MetricRollup.objects.filter(run=run, width=TIERS[0], name__in=missing)
                .values("name").annotate(lo=Min("bucket"), hi=Max("last_step"))
                .values_list("name", "lo", "hi"))
        bounds.update((name, (lo * TIERS[0], hi, False)) for name, lo, hi in rows)
    return bounds


def cover(run: Run, plans: dict[str, tuple[int | None, int, int, bool]]) -> dict[str, list]:
    """{name: [(step, value or RollupRow)] in step order} covering each name's steps
    [a, b) (``plans``: name -> (top tier or None, a, b, whether it has raw points)): the
    closed buckets of ``top`` inside it, the gaps between and around them by the next
    finer tier's, and so on down to the raw points. One query per tier and one for the
    raw points, each an index range per gap. Without raw points, the finest buckets that
    straddle a gap's ends give the points they know in it."""
    gaps = {name: [(a, b)] for name, (_, a, b, _) in plans.items()}
    pieces: dict[str, list] = defaultdict(list)
    for tier in reversed(TIERS):
        spans = [(name, -(-a // tier), b // tier) for name, (top, _, _, _) in plans.items()
                 if top is not None and tier <= top for a, b in gaps[name]]
        spans = [s for s in spans if s[1] < s[2]]
        if not spans:
            continue
        found: dict[str, list[int]] = defaultdict(list)
        for row in rollup_rows(run, tier, set(spans)):
            pieces[row.name].append((row.bucket * tier, row))
            found[row.name].append(row.bucket * tier)
        for name, starts in found.items():
            gaps[name] = minus(gaps[name], sorted(starts), tier)
    has_raw = {name for name, plan in plans.items() if plan[3]}
    for name, step, value in point_ranges(run, [(n, a, b) for n in has_raw for a, b in gaps[n]]):
        pieces[name].append((step, value))
    edges = [(n, a // FINEST, (b - 1) // FINEST + 1) for n in plans.keys() - has_raw
             for a, b in gaps[n]]
    for row in rollup_rows(run, FINEST, set(edges)):
        known = {row.last_step: row.last}
        if row.count:
            known.update({row.low_step: row.low, row.high_step: row.high})
        pieces[row.name] += [(step, value) for step, value in known.items()
                             if any(a <= step < b for a, b in gaps[row.name])]
    return {name: sorted(got, key=lambda p: p[0]) for name, got in pieces.items()}


def minus(gaps: list[tuple[int, int]], starts: list[int], width: int) -> list[tuple[int, int]]:
    """The steps of ``gaps`` (sorted, disjoint [a, b)) outside the buckets [s, s + width)."""
    out = []
    i = 0
    for a, b in gaps:
        while i < len(starts) and starts[i] < b:
            if starts[i] > a:
                out.append((a, starts[i]))
            a = max(a, starts[i] + width)
            i += 1
        if a < b:
            out.append((a, b))
    return out


def fold(pieces: list, lo: int, hi: int, groups: int) -> list[tuple[int, float | None]]:
    """``groups`` equal step ranges of lo..hi, each its lowest and highest value at their
    steps (a step with null where none is finite), then the newest point."""
    buckets: dict[int, Bucket] = defaultdict(Bucket)
    span = hi - lo + 1
    newest: tuple[int, float | None] = (lo - 1, None)
    for at, piece in pieces:
        if isinstance(piece, RollupRow):
            last = (piece.last_step, piece.last)
            known = [(piece.low_step, piece.low), (piece.high_step, piece.high), last] \
                if piece.count else [last]
        else:
            known, last = [(at, piece)], (at, piece)
        newest = max(newest, last, key=lambda p: p[0])
        if groups:
            for step, value in known:
                buckets[min(groups - 1, max(0, (step - lo) * groups // span))].add(step, value)
    kept: dict[int, float | None] = {}
    for bucket in buckets.values():
        if bucket.count:
            kept[bucket.low_step] = bucket.low
            kept[bucket.high_step] = bucket.high
        else:
            kept[bucket.last_step] = None
    if newest[0] >= lo:
        kept[newest[0]] = newest[1]
    return sorted(kept.items())
