"""What the run page plots. One spec per chart serves both the first render (from
MetricPoint / PhaseSpan rows) and the live updates (from events), so the traces that
`Plotly.newPlot` draws and the points that `Plotly.extendTraces` appends always line up:

    steps = [(step, {metric: value}), ...]      spans = [{device, phase, start, end}, ...]
    metric_figures(steps, algorithm) -> [{id, title, traces: [{name, x, ...}], layout}]  page
                                        load; the charts of that algorithm.type (PPO: critic),
                                        each thinned to its min/max envelope past RUN_POINTS
    metric_updates(steps)  -> {chart id: {indices, x: [[...]], y: [[...]]}}        websocket
    other_names(names)     -> the names no chart reads: an external run's page draws one
                              small chart each (its framework's unmapped names, kept as
                              they are), passed as metric_figures(..., others=...) and
                              metric_updates(..., others=True)
    timeline_figure(spans) / timeline_update(spans)  the device Gantt, bars per phase
    control_marks(applied) -> [{step, label}]   a vertical line per live control applied,
                                                drawn on every metric chart (page + socket)
    replacement_marks(replaced) -> [{step, label, color}]   one per rollout worker replaced
                                                (worker.replaced events), in red
    restart_marks(run.restarts) -> [{step, label, color}]  one per driver restart, in red
    compare_figures(runs)  -> one chart per COMPARE_METRICS, a trace per run, x by step;
                              each figure's "wall" holds the same points' x in wall seconds

Every metric chart can be drawn against wall time instead of steps: the pages map each
step to when it was reported (jobs/queries/history.py: History.times) and restyle the x
arrays.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from engine.api import control_label
from engine.api import metrics as M

Values = dict[str, float | None]

TIMELINE_STEPS = 20  # the device timeline keeps roughly this many recent steps
# A timeline trace's index is its phase's place in PHASES (new phases go last there), and
# pages extend traces by index.
PHASES = M.PHASES
CRITIC = "critic"   # PPO's phase: its value model's update
ENV = "env"         # a multi-turn task's phase: its environment's calls
PHASE_COLORS = {"rollout": "#4c78a8", "reward": "#f58518", "learner": "#54a24b",
                "weight_sync": "#e45756", "critic": "#b279a2", "env": "#72b7b2",
                "idle": "#bab0ac"}


@dataclass(frozen=True)
class Trace:
    name: str
    reads: tuple[str, ...]  # the metrics ``value`` combines
    value: Callable[[Values], float | None]
    style: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Chart:
    id: str
    title: str
    traces: tuple[Trace, ...]
    layout: dict = field(default_factory=dict)
    algorithm: str | None = None   # drawn only for runs of this algorithm.type (None: all)


def metric(name: str, label: str | None = None, **style) -> Trace:
    return Trace(label or name, (name,), lambda values: values.get(name), style)


def offset(name: str, by: str, sign: int, label: str, within: tuple[str, str] = (),
           **style) -> Trace:
    """name +- by, for a band; None unless both were reported. ``within`` (low, high):
    the band stops at those where reported (a 0/1 reward's mean + std passes 1, which no
    sample scored)."""
    def value(values: Values) -> float | None:
        center, spread = values.get(name), values.get(by)
        if center is None or spread is None:
            return None
        edge = center + sign * spread
        low, high = (values.get(n) for n in within) if within else (None, None)
        edge = edge if low is None else max(low, edge)
        return edge if high is None else min(high, edge)
    return Trace(label, (name, by, *within), value, style)


def first_of(label: str, names: tuple[str, ...], **style) -> Trace:
    """The first of ``names`` reported: one device slot, whichever kind it was sampled as
    (a "gpu:k" of a CPU box is measured as its process's CPU)."""
    def value(values: Values) -> float | None:
        return next((values[n] for n in names if values.get(n) is not None), None)
    return Trace(label, names, value, style)


# The device charts have a trace per placement device slot (gpu:k / cpu:k): fixed, so the
# first render and every live update agree on trace indices.
DEVICE_SLOTS = 8

REWARD_RANGE = (M.REWARD_MIN, M.REWARD_MAX)
BAND = {"mode": "lines", "line": {"width": 0}, "showlegend": False, "hoverinfo": "skip"}

METRIC_CHARTS: tuple[Chart, ...] = (
    Chart("reward", "Reward (mean, ±1 std)", (
        offset(M.REWARD_MEAN, M.REWARD_STD, -1, "mean - std", REWARD_RANGE, **BAND),
        offset(M.REWARD_MEAN, M.REWARD_STD, +1, "mean + std", REWARD_RANGE, **BAND,
               fill="tonexty",
               fillcolor="rgba(76,120,168,0.2)"),
        metric(M.REWARD_MEAN, "mean", line={"color": "#4c78a8"}),
        # Reported at eval steps only: markers, so a sparse series still shows.
        metric(M.EVAL_REWARD_MEAN, "held-out", mode="lines+markers",
               line={"color": "#e45756"}),
    )),
    Chart("step_time", "Step time by phase (s)", tuple(
        metric(M.PHASE_TIME.of(phase=phase), phase, stackgroup="time",
               line={"color": PHASE_COLORS[phase]})
        for phase in (*PHASES, M.IDLE)
    )),
    # multi-turn runs also draw the rollout engine's prefix-cache hits: a share that
    # falls while rollout share rises is turns prefilled whole again
    Chart("share", "Rollout share and bubble (multi-turn: prefix-cache hits)", (
        metric(M.ROLLOUT_SHARE), metric(M.BUBBLE),
        metric(M.ROLLOUT_PREFIX_HIT_FRAC, "prefix-cache hits", line={"dash": "dot"}),
    ), {"yaxis": {"range": [0, 1]}}),
    Chart("staleness", "Staleness (policy versions)", (
        metric(M.STALENESS_MEAN, "mean"), metric(M.STALENESS_MAX, "max"),
    )),
    # MoE runs that record routing draw, beside the gap, how often the learner's own
    # router picked the rollout's experts: a gap that rises as agreement falls is routing.
    Chart("logprob_gap", "Logprob gap |behaviour - learner| (and MoE routing agreement)", (
        metric(M.LOGPROB_GAP_MEAN, "mean"), metric(M.LOGPROB_GAP_MAX, "max"),
        metric(M.MOE_ROUTING_AGREEMENT, "routing agreement", yaxis="y2",
               line={"dash": "dot"}),
    ), {"yaxis2": {"overlaying": "y", "side": "right", "range": [0, 1],
                   "title": {"text": "agreement"}}}),
    Chart("weight_sync", "Weight sync: latency and versions", (
        metric(M.WEIGHT_SYNC_LATENCY_S, "latency (s)"),
        metric(M.WEIGHT_SYNC_VERSION_LEARNER, "learner version", yaxis="y2",
               line={"dash": "dot"}),
        metric(M.WEIGHT_SYNC_VERSION_ROLLOUT, "rollout version", yaxis="y2",
               line={"dash": "dash"}),
    ), {"yaxis2": {"overlaying": "y", "side": "right", "title": {"text": "version"}}}),
    Chart("device_util", "Devices, measured: GPU (NVML) or process CPU (%)", tuple(
        first_of(f"device {k}", (M.DEVICE_GPU_UTIL.of(device=f"gpu:{k}"),
                                 M.DEVICE_CPU_UTIL.of(device=f"gpu:{k}"),
                                 M.DEVICE_CPU_UTIL.of(device=f"cpu:{k}")))
        for k in range(DEVICE_SLOTS))),
    Chart("device_memory", "Devices, measured: memory used (GB)", tuple(
        first_of(f"device {k}", (M.DEVICE_MEMORY_GB.of(device=f"gpu:{k}"),
                                 M.DEVICE_MEMORY_GB.of(device=f"cpu:{k}")))
        for k in range(DEVICE_SLOTS))),
    Chart("critic", "Critic (PPO): value loss, explained variance, mean value", (
        metric(M.CRITIC_VALUE_LOSS, "value loss"),
        metric(M.CRITIC_EXPLAINED_VARIANCE, "explained variance"),
        metric(M.CRITIC_VALUE_MEAN, "mean value", line={"dash": "dot"}),
    ), algorithm="ppo"),
    Chart("throughput", "Throughput (tokens/s)", (metric(M.THROUGHPUT_TOKENS_PER_S, "tokens/s"),)),
    Chart("response_length", "Response length (tokens)", (
        metric(M.RESPONSE_LENGTH_P50, "p50"), metric(M.RESPONSE_LENGTH_P99, "p99"),
    )),
)

BASE_LAYOUT = {"margin": {"l": 50, "r": 50, "t": 36, "b": 36}, "height": 260,
               "legend": {"orientation": "h"}, "xaxis": {"title": {"text": "step"}}}


def points(chart: Chart, steps: Iterable[tuple[int, Values]]) -> tuple[list, list]:
    """Per trace, the (x, y) arrays of the steps that trace has a value for."""
    xs: list[list] = [[] for _ in chart.traces]
    ys: list[list] = [[] for _ in chart.traces]
    for step, values in steps:
        for i, trace in enumerate(chart.traces):
            y = trace.value(values)
            if y is not None:
                xs[i].append(step)
                ys[i].append(y)
    return xs, ys


RUN_POINTS = 2000  # per chart on the run page's first render; live updates add to it


def envelope(chart: Chart, steps: list[tuple[int, Values]], limit: int = RUN_POINTS) -> list:
    """The steps a chart's first render draws: all of them up to ``limit``; beyond, the
    steps split into equal buckets and each bucket keeps its first and last step and, per
    trace, the step of its lowest and of its highest value. Every spike and dip survives
    thinning (a one-step logprob-gap spike at step 7,431 is still drawn), and the chart's
    traces share their steps, so a band's two edges still pair up point by point."""
    if len(steps) <= limit:
        return steps
    per_bucket = 2 + 2 * len(chart.traces)
    buckets = max(1, limit // per_bucket)
    size = -(-len(steps) // buckets)
    kept: list = []
    for start in range(0, len(steps), size):
        bucket = steps[start:start + size]
        chosen = {0, len(bucket) - 1}
        for trace in chart.traces:
            valued = [(y, i) for i, (_, values) in enumerate(bucket)
                      if (y := trace.value(values)) is not None]
            if valued:
                chosen.update((min(valued)[1], max(valued)[1]))
        kept += [bucket[i] for i in sorted(chosen)]
    return kept


OTHER_CHARTS = 60   # an external run's page charts at most this many names no chart reads
OTHER_LAYOUT = {"height": 200, "showlegend": False}


def other_chart(name: str) -> Chart:
    """The chart of one metric no built-in chart reads: its name as the title."""
    return Chart("other-" + "".join(c if c.isalnum() or c in "_-" else "-" for c in name),
                 name, (metric(name, name),), OTHER_LAYOUT)


def other_names(names: Iterable[str]) -> list[str]:
    """Of ``names``, the ones no built-in chart reads, sorted (so a prefix's metrics sit
    together), at most OTHER_CHARTS of them."""
    charted = metric_names()
    return sorted(set(names) - charted)[:OTHER_CHARTS]


def metric_figures(steps: list[tuple[int, Values]], algorithm: str = "grpo",
                   others: Iterable[str] = (), width: int | None = None,
                   steps_reported: int | None = None) -> list[dict]:
    """One figure per chart of ``algorithm``, then one per name of ``others``; a long
    run's charts are thinned to their envelope (at most RUN_POINTS steps each) and say so
    in their title. ``width``: the steps are buckets of that many steps (two points each,
    jobs/queries/history.py) of a run that reported ``steps_reported`` steps."""
    figures = []
    for chart in (*METRIC_CHARTS, *map(other_chart, others)):
        if chart.algorithm not in (None, algorithm):
            continue
        kept = envelope(chart, steps)
        xs, ys = points(chart, kept)
        traces = [{"name": t.name, "type": "scatter", "mode": "lines", **t.style, "x": x, "y": y,
                   **legend_of(t.name, algorithm)}
                  for t, x, y in zip(chart.traces, xs, ys, strict=True)]
        if width is not None:
            title = (f"{chart.title} · {steps_reported or 0:,} steps, each {width:,}-step "
                     "bucket's min and max drawn")
        elif kept is steps:
            title = chart.title
        else:
            title = f"{chart.title} · {len(steps):,} steps, each bucket's min and max drawn"
        figures.append({"id": chart.id, "title": chart.title, "traces": traces,
                        "layout": {**BASE_LAYOUT, **chart.layout, "title": {"text": title}}})
    return figures


def legend_of(phase: str, algorithm: str, multi_turn: bool = False) -> dict:
    """The critic's phase has a trace (indices stay fixed for extendTraces) but no legend
    entry on a run without one (GRPO's legends listed a critic that never ran); the env
    phase likewise on a run without an environment (``multi_turn``: task.type "env")."""
    hidden = (phase == CRITIC and algorithm != "ppo") or (phase == ENV and not multi_turn)
    return {"showlegend": False} if hidden else {}


def metric_updates(steps: list[tuple[int, Values]], others: bool = False) -> dict[str, dict]:
    """Only the charts and traces that gained points, in extendTraces' shape; with
    ``others``, also each name no built-in chart reads (the page skips a chart it lacks)."""
    updates = {}
    extra = other_names({n for _, values in steps for n in values}) if others else []
    for chart in (*METRIC_CHARTS, *map(other_chart, extra)):
        xs, ys = points(chart, steps)
        indices = [i for i, x in enumerate(xs) if x]
        if indices:
            updates[chart.id] = {"indices": indices, "x": [xs[i] for i in indices],
                                 "y": [ys[i] for i in indices]}
    return updates


def metric_names() -> set[str]:
    """Every metric some chart reads (what the page loads from MetricPoint)."""
    return {name for chart in METRIC_CHARTS for trace in chart.traces for name in trace.reads}


def timeline_bars(spans: Iterable[dict]) -> dict[str, dict[str, list]]:
    """Per phase, Gantt bars on a date axis: base = start (epoch ms), x = duration (ms)."""
    bars: dict[str, dict[str, list]] = {p: {"x": [], "y": [], "base": []} for p in PHASES}
    for span in spans:
        bar = bars.get(span["phase"])
        if bar is None:  # a phase this page does not know how to colour
            continue
        bar["base"].append(span["start"] * 1000.0)
        bar["x"].append((span["end"] - span["start"]) * 1000.0)
        bar["y"].append(span["device"])
    return bars


def timeline_figure(spans: list[dict], algorithm: str = "grpo",
                    multi_turn: bool = False) -> dict:
    devices = {span["device"] for span in spans}
    traces = [{"name": phase, "type": "bar", "orientation": "h",
               "marker": {"color": PHASE_COLORS[phase]}, **bar,
               **legend_of(phase, algorithm, multi_turn)}
              for phase, bar in timeline_bars(spans).items()]
    return {"id": "timeline", "title": "Device timeline", "traces": traces,
            # extendTraces drops the oldest bars beyond this many per phase.
            "max_points": TIMELINE_STEPS * max(1, len(devices)),
            "layout": {**BASE_LAYOUT, "barmode": "overlay",
                       "title": {"text": f"Device timeline (last {TIMELINE_STEPS} steps)"},
                       # Empty, a date axis reads "Jan 2000": no labels until a span
                       # comes (run_charts.js turns them on).
                       "xaxis": {"type": "date", "title": {"text": "time"},
                                 **({} if spans else {"showticklabels": False})},
                       "yaxis": {"type": "category"}}}


def timeline_update(spans: list[dict]) -> dict | None:
    bars = timeline_bars(spans)
    indices = [i for i, bar in enumerate(bars.values()) if bar["x"]]
    if not indices:
        return None
    chosen = [list(bars.values())[i] for i in indices]
    return {"indices": indices, **{key: [bar[key] for bar in chosen]
                                   for key in ("x", "y", "base")}}


def downsample(points: list, limit: int) -> list:
    """At most ``limit`` points, evenly spaced by index; the first and last always kept."""
    if len(points) <= limit:
        return points
    if limit == 1:
        return points[-1:]
    last = len(points) - 1
    return [points[round(i * last / (limit - 1))] for i in range(limit)]


# Run compare: one chart per canonical metric, a trace per run.
COMPARE_METRICS: tuple[tuple[str, str], ...] = (
    (M.REWARD_MEAN, "Reward (mean)"),
    (M.EVAL_REWARD_MEAN, "Held-out reward (eval/reward_mean)"),
    (M.TIME_STEP_S, "Step time (s)"),
    (M.THROUGHPUT_SAMPLES_PER_S, "Samples/s"),
    (M.THROUGHPUT_TOKENS_PER_S, "Tokens/s"),
    (M.ROLLOUT_SHARE, "Rollout share"),
    (M.BUBBLE, "Bubble"),
    (M.STALENESS_MEAN, "Staleness (mean)"),
    (M.LOGPROB_GAP_MEAN, "Logprob gap (mean)"),
    (M.WEIGHT_SYNC_LATENCY_S, "Resync latency (s)"),
    (M.RESPONSE_LENGTH_P50, "Response length p50 (tokens)"),
    (M.LEARNER_LOSS, "Learner loss"),
)
COMPARE_POINTS = 2000  # per trace: a 10,000-step run is drawn from every 5th step
RUN_COLORS = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2")


def compare_figures(runs: list[tuple[str, dict[str, list], dict[int, float]]]) -> list[dict]:
    """``runs``: (label, {metric: [(step, value)]}, {step: wall seconds}) per run, in the
    page's order. A run that did not report a metric still has its (empty) trace, so the
    trace index is the run's index in every chart."""
    figures = []
    for name, title in COMPARE_METRICS:
        traces, walls = [], []
        for i, (label, series, wall) in enumerate(runs):
            kept = downsample([(s, v) for s, v in series.get(name, ()) if v is not None],
                              COMPARE_POINTS)
            traces.append({"name": label, "type": "scatter", "mode": "lines+markers"
                           if len(kept) < 50 else "lines",
                           "line": {"color": RUN_COLORS[i % len(RUN_COLORS)]},
                           "x": [s for s, _ in kept], "y": [v for _, v in kept]})
            walls.append([wall.get(s) for s, _ in kept])
        figures.append({"id": "compare-" + name.replace("/", "-"), "metric": name,
                        "title": title, "traces": traces, "wall": walls,
                        "layout": {**BASE_LAYOUT, "title": {"text": title}}})
    return figures


REPLACED_COLOR = "#e45756"


def replacement_marks(replaced: Iterable[dict]) -> list[dict]:
    """worker.replaced events' payloads -> a red mark at the step of each replacement."""
    return [{"step": e["step"], "label": f"worker {e['worker']} replaced",
             "color": REPLACED_COLOR} for e in replaced]


def restart_marks(restarts: Iterable[dict]) -> list[dict]:
    """Run.restarts -> a red mark at the last step stored before each driver restart."""
    return [{"step": r["step"], "label": "driver restarted", "color": REPLACED_COLOR}
            for r in restarts if r.get("step") is not None]


def control_marks(applied: Iterable[tuple[int, str, float | None]]) -> list[dict]:
    """(step, kind, value) of each applied live control -> the marks the page draws: a
    dotted vertical line at the step the control took effect from, with its label."""
    return [{"step": step, "label": control_label(kind, value)}
            for step, kind, value in applied]
