"""A discrete-event model of the RL loop: what a run would do under a placement and policy.

The loop as engine.orchestration.loop drives it, one driver and its actors:

    driver:   batch = policy.next_batch(step, version)      (waits on worker calls)
              learner update (tokens)                       [learner devices]
              send: learner-side sync; each worker's receive is queued behind its calls
              settle: sync and partial_rollout without overlap wait for every receive,
                      streaming ones don't
              loop overhead (metrics, spans; no device busy)
    worker w: runs its calls in submit order: generate + reward, or a weight receive;
              a call generates with the version of the last receive queued before it

A generate call over rows with r_i tokens still to produce costs
    prefill + decode_step x (decode steps) + decode_row x (tokens)
(the sampler compacts finished rows, so a step costs by its active rows), plus
reward_sample x (scored rows). A call that stops at a target of complete groups
(partial rollout, interruptible fully_async) runs until the target-th group's slowest row
finishes; the other rows keep what they generated and are carried. A carried row's
tokens so far are fed again in the call that continues it (its cache was computed by older
weights), each at what a decoded token costs: on this box's torch sampler a call carrying
8 of 24 groups 15 tokens in costs 1.3-1.6x the same call fresh.

The policies are ports of engine.orchestration.policies (SyncPolicy, StreamingPolicy,
PartialRolloutPolicy) with the same staleness bounds, wait and drop rules, carried groups
and the ExperienceBuffer's take (FIFO, older than the bound: dropped). Actors that
share a host's CPUs slow each other while both compute: each side's phases are stretched
by its probed co-run slowdown (PlanInputs.corun_*) in the share of its time the other
side computes too (simulate). Not modelled: dynamic sampling's extra rounds.

Placements: an actor's calls never overlap; a colocated worker shares the learner's device
(device 0) and waits for it; in the driver's process (colocated, ray = false) nothing
overlaps anything.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np

from engine.config import (
    AsyncPolicyConfig,
    DisaggregatedPlacementConfig,
    FullyAsyncPolicyConfig,
    OneStepOffPolicyConfig,
    PartialRolloutPolicyConfig,
    PlacementConfig,
)
from engine.planner.inputs import PlanInputs

SIM_STEPS = 24        # simulated steps; the first (pipeline fill) is left out of the figures
PASSES = 3            # simulate passes when actors slow each other (see simulate)


@dataclass(frozen=True)
class Shape:
    """Where the actors sit: ``workers`` rollout workers of ``per_worker`` devices each,
    a learner over ``learner_devices``; ``devices`` in all (the bubble's denominator)."""

    label: str
    workers: int
    learner_devices: int
    devices: int
    per_worker: int = 1
    shared: bool = False       # colocated on Ray: worker 0 and the learner share device 0
    serial: bool = False       # colocated in the driver's process: nothing overlaps

    def same_layout(self, other: Shape) -> bool:
        """The same actors on the same devices, whatever the two labels say."""
        return replace(self, label="") == replace(other, label="")


def shape_of(cfg: PlacementConfig) -> Shape:
    if isinstance(cfg, DisaggregatedPlacementConfig):
        n, per = cfg.rollout_workers, cfg.devices_per_worker
        return Shape(f"disaggregated {n}x{per}+{cfg.learner_devices}", n, cfg.learner_devices,
                     n * per + cfg.learner_devices, per)
    if cfg.ray:
        return Shape(f"colocated {cfg.devices} (ray)", cfg.devices, 1, cfg.devices, shared=True)
    if cfg.overlap_threads:     # the worker's thread beside the learner's: as 1 + 1
        return Shape(f"colocated {cfg.devices} (in process, {cfg.overlap_threads} rollout "
                     f"threads)", 1, 1, cfg.devices + 1)
    return Shape(f"colocated {cfg.devices} (in process)", 1, 1, cfg.devices, serial=True)


@dataclass
class Prediction:
    placement: str
    policy: str
    samples_per_s: float
    step_s: float
    bubble: float
    rollout_share: float
    staleness: dict[int, float]     # staleness -> share of trained samples
    dropped_per_step: float         # groups dropped as too stale
    recycled_per_step: float        # groups carried unfinished into a later call
    speedup: float = 1.0            # samples/s over the run's own (set by plan_table)
    shape: Shape | None = field(default=None, repr=False, compare=False)

    @property
    def staleness_max(self) -> int:
        return max(self.staleness, default=0)

    @property
    def staleness_mean(self) -> float:
        return sum(k * v for k, v in self.staleness.items())


@dataclass
class _Group:
    rem: np.ndarray                   # (G,) tokens each row still has to produce
    versions: list[int | None]        # per row: oldest version among its tokens
    done: np.ndarray                  # (G,) bool
    fed: np.ndarray                   # (G,) tokens each row has generated so far

    @property
    def tokens(self) -> int:
        """Tokens generated so far, all rows."""
        return int(self.fed.sum())

    @property
    def oldest(self) -> int | None:
        return min((v for v in self.versions if v is not None), default=None)


@dataclass
class _Call:
    end: float
    complete: list[_Group]
    carry: list[_Group] = field(default_factory=list)


def _sizes(n: int, parts: int) -> list[int]:
    """engine.orchestration.producer.split's slice sizes."""
    k, r = divmod(n, parts)
    return [k + (i < r) for i in range(parts)]


class _Loop:
    """The actors' clocks and busy intervals, the learner's version, the counters."""

    def __init__(self, inp: PlanInputs, shape: Shape, seed: int,
                 scale: tuple[float, float] = (1.0, 1.0)):
        self.inp, self.shape = inp, shape
        # the learner's and the rollout workers' phases stretched by co-running
        self.scale_learner, self.scale_rollout = scale
        self.spans: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        self.rng = np.random.default_rng(seed)
        self.t = 0.0                                  # the driver's clock
        self.free = [0.0] * shape.workers             # each worker's queue drains at
        self.served = [0] * shape.workers             # version of its last queued receive
        self.learner_free = 0.0
        self.version = 0
        self.busy: list[tuple[float, float, int, bool]] = []   # (start, end, devices, rollout)
        self.received: list[tuple[np.ndarray, np.ndarray]] = []  # the workers' receives
        self.dropped = self.recycled = 0

    # -- actors -------------------------------------------------------------------------
    def _slot(self, ready: float, w: int | None) -> float:
        s = self.shape
        start = max(ready, self.learner_free if w is None else self.free[w])
        if s.serial:
            start = max([start, self.learner_free, *self.free])
        elif s.shared and w in (None, 0):
            start = max(start, self.learner_free, self.free[0])
        return start

    def _occupy(self, ready: float, w: int | None, dur: float, rollout: bool = False) -> float:
        start = self._slot(ready, w)
        end = start + dur
        if w is None:
            self.learner_free = end
        else:
            self.free[w] = end
        devices = (self.shape.devices if self.shape.serial else
                   self.shape.learner_devices if w is None else self.shape.per_worker)
        self.busy.append((start, end, devices, rollout))
        if rollout or w is None:
            self.spans[rollout].append((start, end))
        return end

    def overlapped(self, a: float, b: float) -> tuple[float, float]:
        """The share of the learner's busy time in [a, b] during which a rollout worker
        computed too, and the rollout workers' share during which the learner did."""
        learner, rollout = self.spans[False], self.spans[True]
        return overlap_share(learner, rollout, a, b), overlap_share(rollout, learner, a, b)

    def fresh(self, k: int) -> list[_Group]:
        inp = self.inp
        rem = inp.lengths.sample_groups(self.rng, k, inp.group_size, inp.max_new_tokens)
        g = inp.group_size
        return [_Group(r, [None] * g, np.zeros(g, dtype=bool), np.zeros(g)) for r in rem]

    def call(self, w: int, ready: float, groups: list[_Group], target: int | None) -> _Call:
        """Worker ``w`` generates ``groups`` (all rows; or until ``target`` groups are
        complete) and scores the complete ones."""
        inp, version = self.inp, self.served[w]
        left = [np.where(g.done, 0, g.rem) for g in groups]
        # A carried row's tokens so far are fed again under the call's weights (its cache
        # was computed by older ones): a token fed costs what a decoded one does.
        refed = sum(int(g.fed[~g.done].sum()) for g in groups)
        finish = np.array([x.max() for x in left])          # decode steps to complete each
        steps = float(finish.max()) if target is None else \
            float(np.sort(finish)[min(target, len(groups)) - 1])
        complete, carry, tokens = [], [], 0
        for g, x, f in zip(groups, left, finish, strict=True):
            made = np.minimum(x, steps)
            tokens += int(made.sum())
            versions = [v if v is not None or m == 0 else version
                        for v, m in zip(g.versions, made, strict=True)]
            after = _Group(x - made, versions, g.done | (x <= steps), g.fed + made)
            (complete if f <= steps else carry).append(after)
        gen = inp.generate_s(steps, tokens + refed) if steps > 0 else 0.0
        scored = len(complete) * inp.group_size
        env = inp.env_call_s if steps > 0 else 0.0
        end = self._occupy(ready, w, (gen + env + inp.reward_sample_s * scored)
                           * self.scale_rollout, rollout=True)
        self.recycled += len(carry)
        return _Call(end, complete, carry)

    def update(self, batch: list[_Group]) -> list[int]:
        """The learner trains on ``batch``; returns each sample's staleness."""
        inp = self.inp
        staleness = [self.version - v for g in batch for v in g.versions]
        tokens = sum(g.tokens for g in batch)
        self.t = self._occupy(self.t, None, inp.learner_s(tokens, self.shape.learner_devices)
                              * self.scale_learner)
        self.version += 1
        return staleness

    def send(self, wait: bool) -> None:
        inp = self.inp
        self.t = self._occupy(self.t, None, inp.sync_send_s)
        self.served = [self.version] * self.shape.workers
        if self.shape.serial or self.shape.shared:
            first = self._occupy(self.t, 0, inp.recv_s)
        rest = 1 if self.shape.serial or self.shape.shared else 0
        # Every other worker takes its receive after its queued calls: one array op for
        # 1024 workers instead of 1024 events.
        starts = np.maximum(np.asarray(self.free[rest:]), self.t)
        ends = starts + inp.recv_s
        self.free[rest:] = ends.tolist()
        self.received.append((starts, ends))
        if wait:
            self.t = max(self.free if rest == 0 else [first, *self.free[1:]])

    def take(self, buffer: deque, n: int, bound: int | None) -> list[_Group]:
        out = []
        while buffer and len(out) < n:
            g = buffer.popleft()
            if bound is not None and self.version - g.versions[0] > bound:
                self.dropped += 1
                continue
            out.append(g)
        return out


class _Sync:
    overlaps = False

    def __init__(self, loop: _Loop, bound: int | None):
        self.loop, self.buffer, self.bound = loop, deque(), bound

    def next_batch(self) -> list[_Group]:
        loop, n = self.loop, self.loop.inp.prompts_per_step
        calls = [loop.call(w, loop.t, loop.fresh(k), None)
                 for w, k in enumerate(_sizes(n, loop.shape.workers)) if k]
        loop.t = max(c.end for c in calls)
        for c in calls:
            self.buffer += c.complete
        return loop.take(self.buffer, n, self.bound)

    def weights_sent(self) -> None:
        pass


class _Partial(_Sync):
    def __init__(self, loop: _Loop, cfg: PartialRolloutPolicyConfig):
        super().__init__(loop, cfg.staleness_bound)
        self.eta = cfg.staleness_bound
        self.started = math.ceil(loop.inp.prompts_per_step * cfg.over_provision)
        self.carry: list[_Group] = []

    def next_batch(self) -> list[_Group]:
        loop, n, out = self.loop, self.loop.inp.prompts_per_step, []
        while len(out) < n:
            keep = [g for g in self.carry
                    if g.oldest is None or loop.version - g.oldest <= self.eta]
            loop.dropped += len(self.carry) - len(keep)
            groups = keep + loop.fresh(max(0, self.started - len(keep)))
            self.carry, calls = [], []
            shares = _sizes(len(groups), loop.shape.workers)
            targets = _sizes(n - len(out), loop.shape.workers)
            at = 0
            for w, (k, tgt) in enumerate(zip(shares, targets, strict=True)):
                if k:
                    calls.append(loop.call(w, loop.t, groups[at:at + k], min(tgt, k)))
                at += k
            loop.t = max(c.end for c in calls)
            for c in calls:
                self.buffer += c.complete
                self.carry += c.carry
            out += loop.take(self.buffer, n - len(out), self.bound)
        return out


class _Streaming(_Sync):
    overlaps = True

    def __init__(self, loop: _Loop, eta: int, wait: bool, per_call: int, over: float,
                 bound: int | None, ahead: int | None = None):
        super().__init__(loop, bound)
        self.eta, self.wait, self.per_call, self.over = eta, wait, per_call, over
        self.ahead = eta if ahead is None else ahead
        self.sent = 0
        self.inflight: dict[int, _Call] = {}
        self.carry: list[list[_Group]] = [[] for _ in range(loop.shape.workers)]
        self.planned = 0

    def _feed(self) -> None:
        loop, n = self.loop, self.loop.inp.prompts_per_step
        for w in range(loop.shape.workers):
            if w in self.inflight:
                continue
            trains_at = (self.planned + self.per_call - 1) // n
            if self.wait and trains_at - self.sent > self.ahead:
                break                 # every worker serves `sent`: none may start
            self.inflight[w] = self._start(w, trains_at)
            self.planned += self.per_call

    def _start(self, w: int, trains_at: int) -> _Call:
        loop = self.loop
        if self.over == 1.0:
            return loop.call(w, loop.t, loop.fresh(self.per_call), None)
        keep = [g for g in self.carry[w] if g.oldest is None or trains_at - g.oldest <= self.eta]
        loop.dropped += len(self.carry[w]) - len(keep)
        groups = keep + loop.fresh(max(0, math.ceil(self.per_call * self.over) - len(keep)))
        self.carry[w] = []
        return loop.call(w, loop.t, groups, self.per_call)

    def _collect(self) -> None:
        loop = self.loop
        loop.t = max(loop.t, min(c.end for c in self.inflight.values()))
        for w, c in sorted(self.inflight.items(), key=lambda wc: wc[1].end):
            if c.end <= loop.t:
                del self.inflight[w]
                self.buffer += c.complete
                self.carry[w] = c.carry

    def next_batch(self) -> list[_Group]:
        loop, n, out = self.loop, self.loop.inp.prompts_per_step, []
        while len(out) < n:
            self._feed()
            out += loop.take(self.buffer, n - len(out), self.bound)
            if len(out) < n:
                if not self.inflight:
                    raise RuntimeError("planner: no generation in flight; the schedule is stuck")
                self._collect()
        self._feed()
        return out

    def weights_sent(self) -> None:
        self.sent = self.loop.version


def _policy(loop: _Loop, cfg: AsyncPolicyConfig) -> _Sync:
    per_worker = -(-loop.inp.prompts_per_step // loop.shape.workers)
    if isinstance(cfg, OneStepOffPolicyConfig):
        return _Streaming(loop, 1, True, per_worker, 1.0, None)
    if isinstance(cfg, FullyAsyncPolicyConfig):
        return _Streaming(loop, cfg.staleness_bound, cfg.on_stale == "wait",
                          cfg.prompts_per_call or per_worker, cfg.over_provision,
                          cfg.staleness_bound)
    if isinstance(cfg, PartialRolloutPolicyConfig) and cfg.overlap:
        return _Streaming(loop, cfg.staleness_bound, True, per_worker, cfg.over_provision,
                          cfg.staleness_bound, ahead=1)
    if isinstance(cfg, PartialRolloutPolicyConfig):
        return _Partial(loop, cfg)
    return _Sync(loop, None)


def stretch(slowdown: float, share: float) -> float:
    """How much longer a phase takes that runs ``share`` of its time beside the other
    side computing, slowed by ``slowdown`` there (the planner's co-run model)."""
    return 1.0 + (slowdown - 1.0) * share


def overlap_share(mine: list[tuple[float, float]], other: list[tuple[float, float]],
                  a: float, b: float) -> float:
    """The share of ``mine``'s time in [a, b] that ``other`` covers too."""
    if not mine or not other:
        return 0.0
    m = np.clip(np.asarray(mine, dtype=float), a, b)
    o = np.asarray(other, dtype=float)
    o = o[np.argsort(o[:, 0], kind="stable")]
    reach = np.maximum.accumulate(o[:, 1])        # merged into disjoint intervals
    first = np.r_[True, o[1:, 0] > reach[:-1]]
    last = np.r_[np.nonzero(first)[0][1:] - 1, len(o) - 1]
    o = np.clip(np.column_stack([o[first, 0], reach[last]]), a, b)
    total = float((m[:, 1] - m[:, 0]).sum())
    both = np.clip(np.minimum(m[:, 1, None], o[None, :, 1])
                   - np.maximum(m[:, 0, None], o[None, :, 0]), 0.0, None).sum()
    return float(both) / total if total > 0 else 0.0


def _union(intervals: list[tuple[float, float]], a: float, b: float) -> float:
    total, cur = 0.0, None
    for s, e in sorted((max(s, a), min(e, b)) for s, e in intervals if e > a and s < b):
        if cur is None or s > cur[1]:
            total += 0.0 if cur is None else cur[1] - cur[0]
            cur = [s, e]
        else:
            cur[1] = max(cur[1], e)
    return total + (0.0 if cur is None else cur[1] - cur[0])


def simulate(inp: PlanInputs, placement: PlacementConfig | Shape, policy: AsyncPolicyConfig,
             loop_overhead_s: float = 0.0, steps: int = SIM_STEPS, seed: int = 0) -> Prediction:
    """Run ``steps`` steps of the loop in model time; figures over steps 1.. (step 0 fills
    the pipeline, as the benches leave it out).

    Co-running (``inp.corun_learner`` / ``corun_rollout`` above 1): a first pass at the
    sequential costs says what share of each side's busy time the other side computes
    too; each side's phases are then stretched by its slowdown in that share, and the
    loop simulated again (twice: the stretch changes how much they overlap)."""
    shape = placement if isinstance(placement, Shape) else shape_of(placement)
    scale = (1.0, 1.0)
    for _ in range(PASSES if max(inp.corun_learner, inp.corun_rollout) > 1.0
                   and not shape.serial else 1):
        pred, loop, window = _simulate(inp, shape, policy, loop_overhead_s, steps, seed,
                                       scale)
        f_learner, f_rollout = loop.overlapped(*window)
        if f_learner == f_rollout == 0.0:
            break                     # nothing ran beside anything (sync's schedule)
        scale = (stretch(inp.corun_learner, f_learner), stretch(inp.corun_rollout, f_rollout))
    return pred


def _simulate(inp: PlanInputs, shape: Shape, policy: AsyncPolicyConfig,
              loop_overhead_s: float, steps: int, seed: int, scale: tuple[float, float]
              ) -> tuple[Prediction, _Loop, tuple[float, float]]:
    loop = _Loop(inp, shape, seed, scale)
    pol = _policy(loop, policy)
    bounds, samples, staleness = [], 0, []
    dropped_at_1 = 0
    for step in range(steps):
        start = loop.t
        if step == 1:
            dropped_at_1, recycled_at_1 = loop.dropped, loop.recycled
        batch = pol.next_batch()
        ages = loop.update(batch)
        loop.send(wait=not pol.overlaps)
        pol.weights_sent()
        loop.t += loop_overhead_s
        if step >= 1:
            samples += len(ages)
            staleness += ages
        bounds.append((start, loop.t))
    a, b = bounds[1][0], bounds[-1][1]
    wall = b - a
    busy = sum(max(0.0, min(e, b) - max(s, a)) * d for s, e, d, _ in loop.busy)
    busy += shape.per_worker * sum(
        float(np.clip(np.minimum(e, b) - np.maximum(s, a), 0.0, None).sum())
        for s, e in loop.received)
    rollout = _union([(s, e) for s, e, _, r in loop.busy if r], a, b)
    counted = steps - 1
    ages, counts = np.unique(np.asarray(staleness), return_counts=True)
    return Prediction(
        placement=shape.label, policy=policy.type, shape=shape, samples_per_s=samples / wall,
        step_s=wall / counted, bubble=1.0 - busy / (shape.devices * wall),
        rollout_share=rollout / wall,
        staleness={int(k): float(c) / len(staleness) for k, c in zip(ages, counts, strict=True)},
        dropped_per_step=(loop.dropped - dropped_at_1) / counted,
        recycled_per_step=(loop.recycled - recycled_at_1) / counted), loop, (a, b)
