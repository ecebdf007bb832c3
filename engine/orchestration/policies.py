"""Async policies: when rollouts run relative to learner updates.

The loop is fixed -- ``groups = policy.next_batch(step, learner_version)``, learner
update, ``policy.weights_sent(version)`` after the sync is queued. A policy decides when
each rollout worker generates what; all of them go through one ExperienceBuffer of
versioned groups, each within its config's ``staleness_bound`` (eta), which the loop
checks every step:

    sync          all workers produce the step's groups with the current weights   eta = 0
    one_step_off  a worker starts step k+1 as soon as step k's groups are taken,
                  so generation of k+1 overlaps training of k                      eta = 1
    fully_async   every worker always generates; "wait" starts a call only if its
                  groups cannot train more than eta versions later, "drop" never
                  waits and the buffer drops (and counts) groups older than eta     eta
    partial_rollout  over-provision, stop at the step's groups, carry the unfinished
                  ones into the next call; overlap (default): one_step_off's schedule,
                  each worker's next call starts as soon as a step's groups are taken eta

Every scored group enters through ``Experience.admit``: overlong shaping, then dynamic
sampling (algorithm.dynamic_sampling) drops a group whose rewards all agree, and each
policy draws more until its batch is full -- sync in extra rounds of the missing groups,
the streaming ones by generating on -- within max_resample_rounds x prompts_per_step
dropped groups per step; past that a policy returns the groups it has.

Workers are handles (engine.orchestration.actors): in the driver's process a call runs
when submitted, so the schedules hold (same staleness) without overlap; on Ray they run
concurrently with the learner. Calls to one worker run in submit order, so a weight
sync queued before a produce call is what that call generates with.

Live resizing (engine.orchestration.resizing) adds a worker last, serving the learner's
current weights (``joined``), or takes the last one out once the call it has in flight has
finished and its groups are in the buffer (``retire``); a policy splits each call's work
over the workers there are when it starts the call.

A worker that dies during a generation call (Experience.finish) loses the groups it held:
their prompts are dropped, counted under "error" in the data ledger, the loop replaces the
worker (``Experience.on_lost``: engine.orchestration.replacement) and the policy draws on
as for any missing group -- sync in another round, the streaming ones by generating on.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from engine.config import (
    AlgorithmConfig,
    AsyncPolicyConfig,
    FullyAsyncPolicyConfig,
    OneStepOffPolicyConfig,
    PartialRolloutPolicyConfig,
)
from engine.experience import (
    EnvTrace,
    ExperienceBuffer,
    Sample,
    apply_overlong,
    zero_variance,
)
from engine.orchestration.actors import ActorLost, wait_any
from engine.orchestration.ledger import DataStream
from engine.orchestration.partial import PartialGroup, Row
from engine.orchestration.producer import split
from engine.orchestration.workers import RolloutWorker
from engine.rollout.multiturn import Trajectory, close_envs
from engine.seeds import resample_seed, worker_seed
from engine.tasks import Problem, Task


class AsyncPolicy(Protocol):
    name: str
    overlaps: bool        # False: the loop waits for each weight sync before going on

    def next_batch(self, step: int, learner_version: int) -> list[list[Sample]]: ...

    def weights_sent(self, version: int) -> None: ...

    def joined(self, version: int) -> None: ...    # one more worker, last, serving version

    def retire(self, worker: int) -> None: ...     # the last worker leaves: its work done

    def close(self) -> None: ...


DRAWS_PER_RESUME = 1_000_000


@dataclass
class Generation:
    """A generation call in flight: the worker (its place and handle) and the problems
    it holds until it answers."""
    worker: int
    handle: Any
    future: Any
    problems: list[Problem]
    step: int


class Experience:
    """What every policy draws on: the workers, the run's data stream, the buffer.

    Problems come from one DataStream (engine.orchestration.ledger) in order, whatever
    the policy: a resumed run's stream continues from its checkpoint's data position
    (the prompts pending there first), so each training prompt is served once an epoch
    across resumes, and its ledger counts each one trained or dropped. Seeds: the sync
    policy's by step, so a resumed sync run goes on as the uninterrupted one would have;
    the streaming policies' by draw (their k-th generation call), which a resume cannot
    reconstruct: a run resumed at step k starts its draws' seeds at k * DRAWS_PER_RESUME,
    so it never repeats the seeds of the run it resumes."""

    def __init__(self, workers: list, task: Task, buffer: ExperienceBuffer,
                 n_prompts: int, group_size: int, seed: int, resumed_at: int = 0,
                 algorithm: AlgorithmConfig | None = None, max_new_tokens: int = 0,
                 data: DataStream | None = None):
        self.workers, self.task, self.buffer = workers, task, buffer
        self.n_prompts, self.group_size, self.seed = n_prompts, group_size, seed
        self.data = data or DataStream(task, n_prompts)
        self.ledger = self.data.ledger
        # the buffer's staleness drops reach the ledger (through a fault's wrapper too)
        getattr(buffer, "inner", buffer).on_drop = self._dropped_stale
        self.first_draw = resumed_at * DRAWS_PER_RESUME
        self.recycled = 0                 # groups carried into a later step unfinished
        self.algorithm, self.max_new_tokens = algorithm, max_new_tokens
        self.filtering = algorithm is not None and algorithm.dynamic_sampling
        self.drop_budget = algorithm.max_resample_rounds * n_prompts if self.filtering else 0
        self.dropped = 0                  # zero-variance groups dropped in this step
        self.close_faults = EnvTrace()    # closes of dropped trajectories that failed
        # (place, handle, cause, step) of a worker that died in a generation call: the
        # loop replaces it (None: its error is the run's)
        self.on_lost: Callable[[int, Any, str, int], None] | None = None

    def seed_for(self, index: int, worker: int) -> int:
        return worker_seed(self.seed, index, worker)

    def draw(self, n: int) -> list[Problem]:
        """The data stream's next ``n`` problems."""
        return self.data.draw(n)

    def take(self, n: int, learner_version: int) -> list[list[Sample]]:
        """Up to ``n`` groups from the buffer for the learner: counted trained."""
        groups = self.buffer.take(n, learner_version)
        for g in groups:
            self._resolve(g[0].problem)
        return groups

    def keep_fresh(self, carry: list[PartialGroup], trains_at: int,
                   eta: int) -> list[PartialGroup]:
        """The carried groups that may still train at version ``trains_at``; the rest are
        dropped for staleness (counted) before they cost more generation."""
        keep = []
        for g in carry:
            if g.oldest is None or trains_at - g.oldest <= eta:
                keep.append(g)
            else:
                self.buffer.dropped_stale += 1
                self._resolve(g.problem, "stale")
                self.close_trajectories([g])
        return keep

    def close_trajectories(self, groups: list[PartialGroup]) -> None:
        """The environments of carried trajectories that go no further (dropped stale, or
        the run ends), closed here in the driver: a Ray worker's come back pickled, with
        the state they had, so an environment whose close must run where it was made (a
        process or socket of the worker's) cannot be reached from here. Bounded like any
        environment call; one that raises or hangs is counted in env/errors or
        env/timeouts of the step (close_faults)."""
        trajs = [t for g in groups for t in g.rows
                 if isinstance(t, Trajectory) and not t.closed]
        if not trajs:
            return
        _, outcomes = close_envs(trajs, self.task.cfg.env.step_timeout_s)
        self.close_faults.errors += sum(o.status == "error" for o in outcomes)
        self.close_faults.timeouts += sum(o.status == "timeout" for o in outcomes)

    def take_close_faults(self) -> EnvTrace:
        """The driver's failed closes since the last call (for the step's env/* metrics)."""
        out, self.close_faults = self.close_faults, EnvTrace()
        return out

    def _dropped_stale(self, group: list[Sample]) -> None:
        self._resolve(group[0].problem, "stale")

    def _resolve(self, problem: Problem, dropped: str | None = None) -> None:
        if problem.position is not None:
            self.ledger.resolve(problem.position, dropped)

    def begin_step(self) -> None:
        """A policy's next_batch starts: the step's dynamic-sampling count restarts."""
        self.dropped = 0

    def admit(self, group: list[Sample]) -> bool:
        """A scored group: shaped (algorithm.overlong), then into the buffer unless
        dynamic sampling drops it for zero reward variance (counted; returns False)."""
        if self.algorithm is not None:
            apply_overlong(group, self.algorithm.overlong, self.max_new_tokens)
        if self.filtering and zero_variance(group):
            self.dropped += 1
            self._resolve(group[0].problem, "filter")
            return False
        self.buffer.put(group)
        return True

    def exhausted(self) -> bool:
        """Dynamic sampling has dropped its budget of groups this step: draw no more."""
        return self.filtering and self.dropped >= self.drop_budget

    def short_batch(self, step: int, groups: list[list[Sample]]) -> str:
        """A batch that dynamic sampling could not fill within its budget: the warning's
        line when some groups have signal ("" when the batch is full); RuntimeError (the
        run fails) when none has."""
        n = self.n_prompts
        if len(groups) == n:
            return ""
        why = (f"dynamic sampling dropped {self.dropped} groups whose rewards all agreed, its "
               f"bound (algorithm.max_resample_rounds = "
               f"{self.algorithm.max_resample_rounds})")
        if not groups:
            raise RuntimeError(f"step {step}: {why}, and found no group whose rewards differ; "
                               f"raise algorithm.max_resample_rounds, or give the reward room "
                               f"to vary (rollout.temperature, algorithm.group_size, the "
                               f"task's difficulty)")
        return f"step {step}: {why}; trained on {len(groups)} of {n} groups"

    def submit(self, worker: int, index: int, n: int, step: int) -> Generation:
        """Worker ``worker`` generates ``n`` groups: the data stream's next ``n`` problems,
        seeded by draw ``index``."""
        return self.generate(worker, RolloutWorker.produce, step, self.draw(n),
                             self.seed_for(index, worker))

    def generate(self, worker: int, method: Callable, step: int, work: list,
                 *args: Any) -> Generation:
        """``method`` (produce or continue_groups) of worker ``worker`` on ``work``
        (problems, or partial groups)."""
        handle = self.workers[worker]
        problems = [g.problem if isinstance(g, PartialGroup) else g for g in work]
        return Generation(worker, handle, handle.call(method, step, work, *args), problems,
                          step)

    def finish(self, gen: Generation) -> Any | None:
        """What ``gen`` returned; None when its worker died: the problems it held are
        dropped (counted under "error") and the worker replaced (``on_lost``)."""
        try:
            return gen.future.result()
        except ActorLost as exc:
            if self.on_lost is None:
                raise
            for p in gen.problems:
                self._resolve(p, "error")
            self.on_lost(gen.worker, gen.handle, exc.cause, gen.step)
            return None


class SyncPolicy:
    name, overlaps = "sync", False

    def __init__(self, exp: Experience):
        self.exp = exp

    def next_batch(self, step: int, learner_version: int) -> list[list[Sample]]:
        """Round 0 draws the step's problems; each later round (dynamic sampling) draws as
        many fresh ones as groups are missing, seeded by (step, round) like round 0, so a
        resumed run (its data stream continuing the checkpoint's) draws what the
        uninterrupted one did."""
        exp, n, out, rounds = self.exp, self.exp.n_prompts, [], 0
        exp.begin_step()
        problems = exp.draw(n)
        while True:
            calls = []
            for w, mine in enumerate(split(problems, len(exp.workers))):
                if mine:
                    seed = (exp.seed_for(step, w) if rounds == 0
                            else resample_seed(exp.seed, step, rounds, w))
                    calls.append(exp.generate(w, RolloutWorker.produce, step, mine, seed))
            lost = False
            for call in calls:
                groups = exp.finish(call)
                lost = lost or groups is None
                for group in groups or []:
                    exp.admit(group)
            out += exp.take(n - len(out), learner_version)
            if len(out) == n or exp.exhausted() or not (exp.filtering or lost):
                return out
            rounds += 1
            problems = exp.draw(n - len(out))

    def weights_sent(self, version: int) -> None:
        pass

    def joined(self, version: int) -> None:
        pass                          # next_batch splits each round over the workers then

    def retire(self, worker: int) -> None:
        pass                          # no call outlives next_batch

    def close(self) -> None:
        pass


class StreamingPolicy:
    """Keeps workers generating ahead of the learner, within the staleness bound.

    Call c of the stream fills groups [g_c, g_c + n_c); with steps of N groups its last
    group trains at update (g_c + n_c - 1) // N, i.e. at learner version start + that.
    A worker whose weights are at version v may start it ("wait") only if
    start + (g_c + n_c - 1) // N - v <= ahead (eta unless given: overlapped partial
    rollout starts calls one step ahead, and its carried groups may age to eta).
    """

    overlaps = True

    def __init__(self, exp: Experience, name: str, eta: int, wait: bool, per_call: int,
                 start_version: int, over_provision: float = 1.0, ahead: int | None = None):
        self.exp, self.name, self.eta, self.wait = exp, name, eta, wait
        self.ahead = eta if ahead is None else ahead
        self.per_call, self.over = per_call, over_provision
        self.start = start_version
        self.sent = [start_version] * len(exp.workers)   # version each worker will serve
        self.inflight: dict[int, Generation] = {}         # worker -> its call
        self.carry: list[list[PartialGroup]] = [[] for _ in exp.workers]
        self.calls = exp.first_draw                        # draw index of the next call
        self.planned = 0                                   # groups asked for so far

    def _feed(self, step: int) -> None:
        for w in range(len(self.exp.workers)):
            if w in self.inflight:
                continue
            trains_at = self.start + (self.planned + self.per_call - 1) // self.exp.n_prompts
            if self.wait and trains_at - self.sent[w] > self.ahead:
                continue
            self.inflight[w] = self._start(w, trains_at, step)
            self.calls += 1
            self.planned += self.per_call

    def _start(self, w: int, trains_at: int, step: int) -> Generation:
        exp = self.exp
        if self.over == 1.0:
            return exp.submit(w, self.calls, self.per_call, step)
        # Interruptible: start more groups than needed, stop at per_call complete, and
        # continue the unfinished tail in this worker's next call (under newer weights).
        keep = exp.keep_fresh(self.carry[w], trains_at, self.eta)
        fresh = exp.draw(max(0, math.ceil(self.per_call * self.over) - len(keep)))
        groups = keep + [PartialGroup(p, [Row() for _ in range(exp.group_size)]) for p in fresh]
        self.carry[w] = []
        return exp.generate(w, RolloutWorker.continue_groups, step, groups, self.per_call,
                            exp.seed_for(self.calls, w))

    def _collect(self) -> None:
        done = wait_any([g.future for g in self.inflight.values()])
        for w, call in list(self.inflight.items()):
            if call.future in done:
                self._finish(w)

    def _finish(self, w: int) -> None:
        """Worker ``w``'s call in flight, waited for: its groups into the buffer."""
        call = self.inflight.pop(w)
        groups = self.exp.finish(call)
        if groups is None:
            self.planned -= self.per_call   # its groups take no training slots
            return
        if self.over != 1.0:
            groups, self.carry[w] = groups
            self.exp.recycled += len(self.carry[w])
        for group in groups:
            if not self.exp.admit(group):
                self.planned -= 1     # a dropped group takes no training slot

    def next_batch(self, step: int, learner_version: int) -> list[list[Sample]]:
        n, out = self.exp.n_prompts, []
        self.exp.begin_step()
        while len(out) < n:
            self._feed(step)
            out += self.exp.take(n - len(out), learner_version)
            if len(out) < n:
                if self.exp.exhausted():
                    # A short step: the groups planned after it train one step earlier
                    # than their slots say, as if the missing ones had been drawn.
                    self.planned += n - len(out)
                    break
                if not self.inflight:
                    raise RuntimeError(f"{self.name}: no generation in flight and "
                                       f"{len(out)}/{n} groups; the schedule is stuck")
                self._collect()
        self._feed(step)              # generate the next groups while the learner trains
        return out

    def weights_sent(self, version: int) -> None:
        self.sent = [version] * len(self.sent)

    def joined(self, version: int) -> None:
        self.sent.append(version)
        self.carry.append([])

    def retire(self, worker: int) -> None:
        """Its call in flight finishes (its groups train like any others); the groups it
        carries unfinished go on in worker 0's next call."""
        if worker in self.inflight:
            self._finish(worker)
        self.carry[0] += self.carry.pop(worker)
        self.sent.pop(worker)

    def close(self) -> None:
        for w, call in list(self.inflight.items()):
            res = self.exp.finish(call)  # let the workers finish before they are torn down
            if self.over != 1.0 and res is not None:
                self.carry[w] += res[1]
        self.inflight.clear()
        self.exp.close_trajectories([g for carried in self.carry for g in carried])
        self.carry = [[] for _ in self.carry]


class PartialRolloutPolicy:
    """The synchronous form (async_policy.overlap = false): each step's generation after
    the previous update; the overlapped form is a StreamingPolicy (build_policy)."""

    name, overlaps = "partial_rollout", False

    def __init__(self, exp, cfg: PartialRolloutPolicyConfig):
        self.exp, self.eta = exp, cfg.staleness_bound
        self.started = math.ceil(exp.n_prompts * cfg.over_provision)
        self.carry: list[PartialGroup] = []
        self.draws = exp.first_draw       # index of the next round: its problems and seeds

    def next_batch(self, step: int, learner_version: int) -> list[list[Sample]]:
        exp, n, out = self.exp, self.exp.n_prompts, []
        exp.begin_step()
        while len(out) < n and not exp.exhausted():
            keep = exp.keep_fresh(self.carry, learner_version, self.eta)
            fresh = exp.draw(max(0, self.started - len(keep)))
            groups = keep + [PartialGroup(p, [Row() for _ in range(exp.group_size)])
                             for p in fresh]
            self.carry = []
            calls = []
            shares = split(groups, len(exp.workers))
            targets = split(list(range(n - len(out))), len(exp.workers))
            for w, (mine, tgt) in enumerate(zip(shares, targets, strict=True)):
                if mine:
                    calls.append(exp.generate(w, RolloutWorker.continue_groups, step, mine,
                                              min(len(tgt), len(mine)),
                                              exp.seed_for(self.draws, w)))
            for call in calls:
                if (res := exp.finish(call)) is None:
                    continue
                complete, carry = res
                for group in complete:
                    exp.admit(group)
                self.carry += carry
            exp.recycled += len(self.carry)
            self.draws += 1
            out += exp.take(n - len(out), learner_version)
        return out

    def weights_sent(self, version: int) -> None:
        pass

    def joined(self, version: int) -> None:
        pass                          # next_batch splits each round over the workers then

    def retire(self, worker: int) -> None:
        pass                          # no call outlives next_batch

    def close(self) -> None:
        self.exp.close_trajectories(self.carry)
        self.carry = []


def buffer_bound(cfg: AsyncPolicyConfig) -> int | None:
    """Staleness beyond which the buffer drops groups: for the policies that may outrun
    their bound. Sync and one-step-off cannot; if a bug makes them, the loop reports it."""
    if isinstance(cfg, FullyAsyncPolicyConfig | PartialRolloutPolicyConfig):
        return cfg.staleness_bound
    return None


def build_policy(cfg: AsyncPolicyConfig, exp: Experience, start_version: int) -> AsyncPolicy:
    per_worker = -(-exp.n_prompts // len(exp.workers))
    if isinstance(cfg, OneStepOffPolicyConfig):
        return StreamingPolicy(exp, cfg.type, cfg.staleness_bound, True, per_worker,
                               start_version)
    if isinstance(cfg, FullyAsyncPolicyConfig):
        return StreamingPolicy(exp, cfg.type, cfg.staleness_bound, cfg.on_stale == "wait",
                               cfg.prompts_per_call or per_worker, start_version,
                               cfg.over_provision)
    if isinstance(cfg, PartialRolloutPolicyConfig) and cfg.overlap:
        return StreamingPolicy(exp, cfg.type, cfg.staleness_bound, True, per_worker,
                               start_version, cfg.over_provision, ahead=1)
    if isinstance(cfg, PartialRolloutPolicyConfig):
        return PartialRolloutPolicy(exp, cfg)
    return SyncPolicy(exp)

