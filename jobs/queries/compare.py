"""Run compare: which runs, and the figures that put them side by side. Pure functions over
stored series, so the page, its JSON endpoint and the tests compute the same numbers, and
``compare_data``, which loads the runs' series and applies them (the page and the REST API
both serve it):

    series = {metric name: [(step, value), ...]}   in step order, values may be None
    wall   = {step: seconds since the run's first step was reported}
    summarize(series, wall, level) -> {"samples_per_s": ..., "resync_p99_s": ..., ...}
    config_differences({label: config}) -> [(dotted key, [value per run])]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from engine.api import metrics as M
from engine.config import FRAMEWORK_LABELS
from jobs import charts
from jobs.models import Run
from jobs.models.validators import parse_pk
from jobs.queries import history, run_page

Series = Sequence[tuple[int, float | None]]
MIN_RUNS, MAX_RUNS = 2, 6
TRAIN_REWARD, HELD_OUT_REWARD = M.REWARD_MEAN, M.EVAL_REWARD_MEAN

# The summary's columns: key -> what it is, as the page heads them.
SUMMARY_FIELDS = {
    "steps": "steps reported",
    "samples_per_s": "samples/s (mean)",
    "tokens_per_s": "tokens/s (mean)",
    M.BUBBLE: "bubble (mean)",
    M.ROLLOUT_SHARE: "rollout share (mean)",
    "staleness_mean": "staleness (mean)",
    "staleness_max": "staleness (max)",
    "resync_p50_s": "resync latency p50 (s)",
    "resync_p99_s": "resync latency p99 (s)",
    "held_out_final": "held-out reward (final)",
    "held_out_best": "held-out reward (best)",
    "reach_step": "first step reward ≥ level",
    "reach_s": "time to reward ≥ level (s)",
    "reach_held_out_step": "first step held-out ≥ level",
    "reach_held_out_s": "time to held-out ≥ level (s)",
}
# The series the summary reads (the page loads these besides the charts' own).
SUMMARY_METRICS = (M.THROUGHPUT_SAMPLES_PER_S, M.THROUGHPUT_TOKENS_PER_S, M.BUBBLE,
                   M.ROLLOUT_SHARE, M.STALENESS_MEAN, M.STALENESS_MAX, M.WEIGHT_SYNC_LATENCY_S,
                   TRAIN_REWARD, HELD_OUT_REWARD)


class CompareError(ValueError):
    """A selection the compare page cannot show: the query parameter at fault (``field``)
    and the fix (``message``); ``str()`` is "field: message", as the page shows it."""

    def __init__(self, field: str, message: str):
        self.field, self.message = field, message
        super().__init__(f"{field}: {message}")


def parse_ids(values: Sequence[str]) -> list[int]:
    """Run ids from ``?ids=1,2,3`` (or ``?ids=1&ids=2``), in order, each once: 2 to 6."""
    ids: list[int] = []
    for part in ",".join(values).split(","):
        part = part.strip()
        if not part:
            continue
        pk = parse_pk(part)
        if pk is None:
            raise CompareError("ids", f"{part!r} is not a run id; give run numbers, e.g. "
                                      "?ids=3,7")
        if pk not in ids:
            ids.append(pk)
    if not MIN_RUNS <= len(ids) <= MAX_RUNS:
        raise CompareError("ids", f"compare {MIN_RUNS} to {MAX_RUNS} runs, got {len(ids)}; "
                                  "select them on the runs list, e.g. ?ids=3,7")
    return ids


def parse_level(text: str | None) -> float | None:
    """The reward level the operator picked ('' or None: none picked)."""
    if text is None or not text.strip():
        return None
    try:
        level = float(text)
    except ValueError:
        raise CompareError("level", f"{text!r} is not a number; give a reward such as "
                                    "0.5") from None
    if not math.isfinite(level):
        raise CompareError("level",
                           f"{text!r} is not a finite number; give a reward such as 0.5")
    return level


def finite(series: Series) -> list[tuple[int, float]]:
    return [(step, v) for step, v in series if v is not None and math.isfinite(v)]


def mean(series: Series) -> float | None:
    values = [v for _, v in finite(series)]
    return sum(values) / len(values) if values else None


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between closest ranks (numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        return None
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def first_reaching(series: Series, level: float) -> int | None:
    """The first step whose value is at least ``level``, or None if none is."""
    return next((step for step, v in finite(series) if v >= level), None)


def summarize(series: Mapping[str, Series], wall: Mapping[int, float],
              level: float | None = None) -> dict[str, float | int | None]:
    """One run's summary row (None where the run reported nothing to compute it from)."""
    def of(name: str) -> Series:
        return series.get(name, ())

    latency = [v for _, v in finite(of(M.WEIGHT_SYNC_LATENCY_S))]
    held_out = finite(of(HELD_OUT_REWARD))
    stale_max = [v for _, v in finite(of(M.STALENESS_MAX))]
    steps = {step for s in series.values() for step, _ in s}
    row: dict[str, float | int | None] = {
        "steps": len(steps),
        "samples_per_s": mean(of(M.THROUGHPUT_SAMPLES_PER_S)),
        "tokens_per_s": mean(of(M.THROUGHPUT_TOKENS_PER_S)),
        M.BUBBLE: mean(of(M.BUBBLE)),
        M.ROLLOUT_SHARE: mean(of(M.ROLLOUT_SHARE)),
        "staleness_mean": mean(of(M.STALENESS_MEAN)),
        "staleness_max": max(stale_max) if stale_max else None,
        "resync_p50_s": percentile(latency, 50),
        "resync_p99_s": percentile(latency, 99),
        "held_out_final": held_out[-1][1] if held_out else None,
        "held_out_best": max(v for _, v in held_out) if held_out else None,
    }
    for key, name in (("reach", TRAIN_REWARD), ("reach_held_out", HELD_OUT_REWARD)):
        step = first_reaching(of(name), level) if level is not None else None
        row[f"{key}_step"] = step
        row[f"{key}_s"] = wall.get(step) if step is not None else None
    return row


def since_start(times: Mapping[int, float]) -> dict[int, float]:
    """{step: unix time} -> {step: seconds since the earliest of them}."""
    if not times:
        return {}
    start = min(times.values())
    return {step: ts - start for step, ts in times.items()}


def flatten(table: Mapping, prefix: str = "") -> dict[str, object]:
    """{"a": {"b": 1}} -> {"a.b": 1}: a config's leaves by dotted key."""
    out: dict[str, object] = {}
    for key, value in table.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def config_differences(configs: Sequence[Mapping]) -> list[tuple[str, list]]:
    """The dotted keys whose values are not the same in every config (name included),
    each with its value per config (None where a config lacks the key)."""
    flat = [flatten(c) for c in configs]
    keys = sorted({k for f in flat for k in f})
    rows = [(key, [f.get(key) for f in flat]) for key in keys]
    return [(key, values) for key, values in rows
            if any(v != values[0] for v in values[1:])]


class RunsMissing(CompareError):
    """An id that names no run (the API's 404; the page shows it like any other)."""


def selected_runs(ids: list[int]) -> list[Run]:
    """The runs, in the order asked; CompareError naming any id that is no run."""
    by_id = Run.objects.in_bulk(ids)
    missing = [str(pk) for pk in ids if pk not in by_id]
    if missing:
        raise RunsMissing("ids", f"no run {', '.join(missing)}; pick runs from the runs list")
    return [by_id[pk] for pk in ids]


def run_label(run: Run) -> str:
    """A run as compare's legends name it; a run another framework trains says which."""
    label = f"#{run.pk} {run.name}"
    return f"{label} ({FRAMEWORK_LABELS.get(run.framework, run.framework)})" \
        if run.is_external else label


def compare_data(runs: list[Run], level: float | None) -> dict:
    """What the page draws and the JSON endpoint returns: per run its summary row, the
    config keys that differ, and the overlaid charts. An external run's series are under
    the canonical names its framework's are mapped to, so they overlay a native run's;
    its config (framework, params) is diffed key by key like a RunConfig. A long run's
series are its tiers' buckets (jobs/queries/history.py): its summary's means and
percentiles are then over each bucket's min and max, not every step."""
    names = {name for name, _ in charts.COMPARE_METRICS} | set(SUMMARY_METRICS)
    loaded, summaries = [], []
    with run_page.snapshot():
        for run in runs:
            drawn = history.load(run, names)
            series = {name: [(x, values[name]) for x, values in drawn.steps if name in values]
                      for name in names}
            wall = since_start(drawn.times)
            loaded.append((run, series, wall))
            summary = summarize(series, wall, level)
            if drawn.width is not None:  # a long run's series are its buckets' min and max
                summary["steps"] = drawn.steps_reported
            summaries.append(summary)
    differences = config_differences([run.config for run, _, _ in loaded])
    return {
        "level": level,
        "runs": [{"id": run.pk, "name": run.name, "status": run.status,
                  "framework": run.framework,
                  "parent_id": run.parent_id, "summary": summary}
                 for (run, _, _), summary in zip(loaded, summaries, strict=True)],
        "config_diff": [{"key": key, "values": values} for key, values in differences],
        "charts": charts.compare_figures([(run_label(run), series, wall)
                                          for run, series, wall in loaded]),
    }


def selection(request) -> tuple[list[Run], float | None]:
    return selected_runs(parse_ids(request.GET.getlist("ids"))), \
        parse_level(request.GET.get("level"))
