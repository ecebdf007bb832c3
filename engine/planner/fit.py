"""Fit the planner's inputs from what a run reported: its config, step metrics and spans.

    fit = fit_run(cfg, metrics, spans)      # metrics: [{name: value}] per step, in order;
                                            # spans: objects with device, phase, start,
                                            # end, step (SpanEvent, the control plane's rows)
    fit = fit_run_dir(Path("runs/demo"))     # config.toml + events.jsonl of a run directory

Per step (the first left out: warm-up), with W rollout workers and tokens the step trained:

    time/rollout_s  = prefill + decode_step x response_length/max + decode_row x tokens / W
    time/reward_s   = reward_sample x samples / W
    time/env_s      = env_call: a multi-turn task's environment calls per generate call
                      (the union of their spans), not divided by W
    time/learner_s  = learner_step + learner_token / learner devices x tokens
    weight_sync     = the learner side's spans (send) and each worker's (receive)
    loop overhead   = step time that no phase of any device covers

each by non-negative least squares over the steps, leaving out a step a hiccup slowed
(robust_nnls); the learner's steps weighted by 1 / their tokens (a step's noise grows with
its size, and a learner whose per-token cost grows with the batch would otherwise be fitted
to its biggest steps and charged more than the run spent). Exact for a sync run (phases in
sequence, one call per worker per step); a run under another policy fits the same way,
with calls that stop early or overlap blurring the decode split. Response lengths are the
steps' rows pooled (the mixture of each step's quantile curve, pooled_quantiles), bent
within each interval to give response_length/mean (linear interpolation overstates a long
tail's mean), and how alike a group's rows are is matched to
response_length/group_max_mean.
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from engine import metrics as M
from engine.config import RunConfig, load_config
from engine.orchestration.placement import layout_for
from engine.planner.inputs import LengthModel, PlanInputs
from engine.planner.model import Shape, overlap_share, shape_of, stretch

QUANTILE_METRICS = ((M.RESPONSE_LENGTH_MIN, 0.0),
                    *((M.RESPONSE_LENGTH_QUANTILE[q], q / 100) for q in M.LENGTH_QUANTILES),
                    (M.RESPONSE_LENGTH_MAX, 1.0))
BUSY = ("rollout", "reward", "learner", "weight_sync", "env")
MAX_FIT_STEPS = 50      # the latest steps: lengths and costs drift as a run learns
OUTLIER_MADS = 6.0      # robust_nnls: a step this far off the others' line is left out
MIN_ROBUST_STEPS = 6    # fewer steps: every one is kept
# the quantiles the length model keeps of the steps' rows pooled (finer in the tail, where
# partial rollout's drops and a sync step's longest call are decided)
LENGTH_LEVELS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.97, 0.98, 0.99, 0.995, 1.0)


class FitError(ValueError):
    """The run has too little to fit from (no completed step with timings)."""


@dataclass
class Fit:
    inputs: PlanInputs
    shape: Shape                 # where the fitted run ran
    loop_overhead_s: float
    steps: int                   # steps the fit used
    policy: str                  # the fitted run's async policy


def nnls(x: np.ndarray, y: np.ndarray, weight: np.ndarray | None = None) -> np.ndarray:
    """Least squares with every coefficient >= 0, by trying each subset of the columns
    (a handful here): the best fit among those whose coefficients are all >= 0.
    ``weight``: each row's weight (1 / its variance)."""
    if weight is not None:
        w = np.sqrt(weight)
        x, y = x * w[:, None], y * w
    best, best_err = np.zeros(x.shape[1]), float(np.sum(y ** 2))
    for k in range(1, x.shape[1] + 1):
        for cols in itertools.combinations(range(x.shape[1]), k):
            coef = np.linalg.lstsq(x[:, cols], y, rcond=None)[0]
            if np.all(coef >= 0):
                err = float(np.sum((x[:, cols] @ coef - y) ** 2))
                if err < best_err - 1e-15:
                    full = np.zeros(x.shape[1])
                    full[list(cols)] = coef
                    best, best_err = full, err
    return best


def robust_nnls(x: np.ndarray, y: np.ndarray, weight: np.ndarray | None = None) -> np.ndarray:
    """nnls without the steps a hiccup slowed (an allocator's first touch, a GC, another
    process), which would otherwise set the cost of every step the planner predicts. A
    step is left out when its residual from the line fitted to the other steps is more
    than OUTLIER_MADS times theirs (1.4826 x their median absolute residual): judged
    against a line it did not pull, so one stall among few steps cannot hide itself.
    At most one step in ten is left out, the farthest first."""
    w = np.ones(len(y)) if weight is None else np.asarray(weight, dtype=float)
    keep = np.ones(len(y), dtype=bool)
    if len(y) >= MIN_ROBUST_STEPS:
        for _ in range(max(1, len(y) // 10)):
            worst, worst_i = OUTLIER_MADS, None
            for i in np.flatnonzero(keep):
                others = keep.copy()
                others[i] = False
                resid = (y - x @ nnls(x[others], y[others], w[others])) * np.sqrt(w)
                scale = 1.4826 * float(np.median(np.abs(resid[others])))
                if scale > 0 and abs(resid[i]) > worst * scale:
                    worst, worst_i = abs(resid[i]) / scale, i
            if worst_i is None:
                break
            keep[worst_i] = False
    return nnls(x[keep], y[keep], w[keep])


def _mean_group_max(lengths: LengthModel, corr: float, g: int, budget: int) -> float:
    model = replace(lengths, group_corr=corr)
    return float(model.sample_groups(np.random.default_rng(0), 4000, g, budget).max(1).mean())


def _bisect(f, lo: float, hi: float, want: float, rounds: int = 20) -> float:
    """x in [lo, hi] where the increasing function f reaches ``want`` (clamped)."""
    for _ in range(rounds):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < want else (lo, mid)
    return (lo + hi) / 2


def _step_cdf(points: list[tuple[float, float]], x: np.ndarray) -> np.ndarray:
    """One step's share of rows at most ``x`` tokens long: its quantiles (q, length),
    lengths non-decreasing, joined linearly (right-continuous where lengths tie)."""
    q = np.array([p[0] for p in points])
    ln = np.maximum.accumulate([p[1] for p in points])
    j = np.searchsorted(ln, x, side="right") - 1          # last point at or below x
    inside = (j >= 0) & (j < len(ln) - 1)
    k = np.clip(j, 0, len(ln) - 2)
    t = np.where(inside, (x - ln[k]) / np.where(ln[k + 1] > ln[k], ln[k + 1] - ln[k], 1.0),
                 0.0)
    return np.where(j < 0, 0.0, np.where(j >= len(ln) - 1, 1.0, q[k] + (q[k + 1] - q[k]) * t))


def pooled_quantiles(steps: list[list[tuple[float, float]]]
                     ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The quantiles (at LENGTH_LEVELS) of every step's rows together, from each step's
    own quantiles: the mixture of the steps' distributions, not the mean of their
    quantiles. Averaging quantiles narrows the tail: the long-tail recipe's steps have
    maxima of 17 to 45 tokens, which average to 35, so a model fitted that way never
    drew a group past 35, where the run had a tenth of its groups."""
    lo = min(p[0][1] for p in steps)
    hi = max(max(x for _, x in p) for p in steps)
    if hi <= lo:
        return (0.0, 1.0), (lo, lo)
    grid = np.linspace(lo, hi, 4001)
    cdf = np.mean([_step_cdf(p, grid) for p in steps], axis=0)
    cdf[-1] = 1.0
    levels = np.asarray(LENGTH_LEVELS)
    i = np.clip(np.searchsorted(cdf, levels, side="left"), 1, len(grid) - 1)
    t = np.clip((levels - cdf[i - 1]) / np.maximum(cdf[i] - cdf[i - 1], 1e-12), 0.0, 1.0)
    x = grid[i - 1] + (grid[i] - grid[i - 1]) * t
    x[0], x[-1] = lo, hi
    return tuple(levels.tolist()), tuple(np.maximum.accumulate(x).tolist())


def fit_lengths(rows: list[dict[str, float]], group_size: int, budget: int) -> LengthModel:
    steps = []
    for m in rows:
        points = sorted((q, m[name]) for name, q in QUANTILE_METRICS if name in m)
        if not points:
            continue
        if points[0][0] != 0.0:
            points.insert(0, (0.0, min(1.0, points[0][1])))
        if points[-1][0] != 1.0:
            points.append((1.0, max(x for _, x in points)))
        steps.append(points)
    if not steps:
        raise FitError("the run reported no response-length quantiles (response_length/*)")
    model = LengthModel(*pooled_quantiles(steps))
    means = [m[M.RESPONSE_LENGTH_MEAN] for m in rows if M.RESPONSE_LENGTH_MEAN in m]
    if means:            # the curve within the intervals that gives the measured mean
        curve = _bisect(lambda c: -replace(model, curve=c).mean, 0.05, 20.0,
                        -statistics.fmean(means))
        model = replace(model, curve=round(curve, 3))
    target = [m[M.RESPONSE_LENGTH_GROUP_MAX_MEAN] for m in rows
              if M.RESPONSE_LENGTH_GROUP_MAX_MEAN in m]
    if target:           # more alike rows -> a smaller group max
        corr = _bisect(lambda c: -_mean_group_max(model, c, group_size, budget), 0.0, 1.0,
                       -statistics.fmean(target), rounds=12)
        model = replace(model, group_corr=round(corr, 3))
    return model


def _phase_by_step(spans, devices: set[str], phase: str) -> dict[int, float]:
    """Per step: the longest single device's summed ``phase`` time among ``devices``."""
    per: dict[tuple[int, str], float] = {}
    for s in spans:
        if s.phase == phase and s.device in devices:
            per[(s.step, s.device)] = per.get((s.step, s.device), 0.0) + s.end - s.start
    out: dict[int, float] = {}
    for (step, _), v in per.items():
        out[step] = max(out.get(step, 0.0), v)
    return out


def fit_run(cfg: RunConfig, metrics: list[dict[str, float]], spans=(),
            steps: list[int] | None = None) -> Fit:
    """``metrics``: each step's values in step order (``steps`` their step numbers, for
    the spans; default 0, 1, ...)."""
    numbered = list(zip(steps or range(len(metrics)), metrics, strict=True))
    timed = [(s, m) for s, m in numbered if M.TIME_STEP_S in m and M.TIME_LEARNER_S in m]
    used = (timed[1:] if len(timed) > 1 else timed)[-MAX_FIT_STEPS:]
    if not used:
        raise FitError("the run has no step with timings yet: let it finish a step, "
                       "then plan again")
    rows = [m for _, m in used]
    shape = shape_of(cfg.placement)
    layout = layout_for(cfg.placement)
    n, g = cfg.rollout.prompts_per_step, cfg.algorithm.group_size
    workers = shape.workers
    tokens = np.array([m[M.THROUGHPUT_TOKENS_PER_S] * m[M.TIME_STEP_S] for m in rows])
    ones = np.ones(len(rows))

    longest = np.array([m[M.RESPONSE_LENGTH_MAX] for m in rows])
    prefill, step_s, row_s = robust_nnls(np.column_stack([ones, longest, tokens / workers]),
                                  np.array([m[M.TIME_ROLLOUT_S] for m in rows]))
    reward = statistics.fmean(m[M.TIME_REWARD_S] for m in rows) / (n * g / workers)
    l_step, l_tok = robust_nnls(np.column_stack([ones, tokens]),
                         np.array([m[M.TIME_LEARNER_S] for m in rows]), 1 / tokens)

    learner_dev = set(layout.learner.devices) - set(layout.rollout)
    worker_dev = {w.devices[0] for w in layout.workers} - set(layout.learner.devices) \
        if not shape.serial else set()
    wanted = {s for s, _ in used}
    spans = [s for s in spans if s.step in wanted]
    send = _phase_by_step(spans, learner_dev or set(layout.devices), "weight_sync")
    recv = _phase_by_step(spans, worker_dev, "weight_sync")
    whole = [m[M.TIME_WEIGHT_SYNC_S] for m in rows]
    if send or recv:
        send_s = statistics.median(send.values()) if send else 0.0
        recv_s = statistics.median(recv.values()) if recv else 0.0
    else:                      # no spans: the sync's time all on the learner's side
        send_s, recv_s = statistics.median(whole), 0.0
    # The union of the env spans (a call's rows step their environments at once, one span
    # each): the workers' calls run side by side, so about one worker's env time.
    env_s = statistics.median(m.get(M.TIME_ENV_S, 0.0) for m in rows)
    overhead = statistics.median(
        max(0.0, m[M.TIME_STEP_S] - sum(m.get(M.PHASE_TIME.of(phase=p), 0.0) for p in BUSY))
        for m in rows) \
        if cfg.async_policy.type == "sync" or (cfg.async_policy.type == "partial_rollout"
                                               and not cfg.async_policy.overlap) else \
        statistics.median(max(0.0, m[M.TIME_STEP_S] - max(
            m[M.TIME_ROLLOUT_S] + m[M.TIME_REWARD_S] + m.get(M.TIME_ENV_S, 0.0),
            m[M.TIME_LEARNER_S] + m[M.TIME_WEIGHT_SYNC_S])) for m in rows)
    inputs = PlanInputs(
        prompts_per_step=n, group_size=g, max_new_tokens=cfg.rollout.max_new_tokens,
        lengths=fit_lengths(rows, g, cfg.rollout.max_new_tokens),
        prefill_s=float(prefill), decode_step_s=float(step_s), decode_row_s=float(row_s),
        reward_sample_s=reward, learner_step_s=float(l_step),
        learner_token_s=float(l_tok) * shape.learner_devices,
        sync_send_s=send_s, sync_recv_s=recv_s,
        sync_bytes=statistics.fmean(m.get(M.WEIGHT_SYNC_BYTES, 0.0) for m in rows),
        env_call_s=env_s)
    return Fit(_sequential(inputs, rows, spans), shape, overhead, len(rows),
               cfg.async_policy.type)


def _sequential(inputs: PlanInputs, rows: list[dict[str, float]], spans) -> PlanInputs:
    """The co-run slowdowns the run probed (host/corun_slowdown/*), and its costs as if
    nothing had run beside them: a run whose learner and rollout workers overlapped
    measured each phase stretched by the other side's computing, in the share of its time
    the spans show them together (the same stretch simulate applies)."""
    slow = {k: statistics.median(m[M.HOST_CORUN_SLOWDOWN.of(actor=k)] for m in rows
                                 if M.HOST_CORUN_SLOWDOWN.of(actor=k) in m)
            for k in ("learner", "rollout")
            if any(M.HOST_CORUN_SLOWDOWN.of(actor=k) in m for m in rows)}
    if not slow:
        return inputs
    c_learner, c_rollout = slow.get("learner", 1.0), slow.get("rollout", 1.0)
    learner = [(s.start, s.end) for s in spans if s.phase == "learner"]
    rollout = [(s.start, s.end) for s in spans if s.phase in ("rollout", "reward", "env")]
    if learner and rollout:
        a = min(x for x, _ in learner + rollout)
        b = max(y for _, y in learner + rollout)
        div_l = stretch(c_learner, overlap_share(learner, rollout, a, b))
        div_r = stretch(c_rollout, overlap_share(rollout, learner, a, b))
    else:
        div_l = div_r = 1.0
    return replace(inputs, corun_learner=c_learner, corun_rollout=c_rollout,
                   learner_step_s=inputs.learner_step_s / div_l,
                   learner_token_s=inputs.learner_token_s / div_l,
                   prefill_s=inputs.prefill_s / div_r, decode_step_s=inputs.decode_step_s / div_r,
                   decode_row_s=inputs.decode_row_s / div_r,
                   reward_sample_s=inputs.reward_sample_s / div_r,
                   env_call_s=inputs.env_call_s / div_r)


def fit_run_dir(run_dir: Path) -> Fit:
    """Fit from a run directory the engine wrote (config.toml, events.jsonl)."""
    from engine.events import MetricsEvent, SpanEvent
    from engine.telemetry.sinks import read_jsonl

    run_dir = Path(run_dir)
    cfg_path, events_path = run_dir / "config.toml", run_dir / "events.jsonl"
    for p in (cfg_path, events_path):
        if not p.exists():
            raise FitError(f"{p} is missing: RUN_DIR must be a run directory the engine "
                           f"wrote (telemetry.jsonl = true)")
    events = read_jsonl(events_path)
    by_step: dict[int, dict[str, float]] = {}
    for e in events:
        if isinstance(e, MetricsEvent) and M.TIME_STEP_S in e.values:
            by_step[e.step] = e.values
    order = sorted(by_step)
    spans = [e for e in events if isinstance(e, SpanEvent)]
    return fit_run(load_config(cfg_path), [by_step[s] for s in order], spans, order)
