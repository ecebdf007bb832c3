"""Reward as a service: score inline after generation, or stream to a pool of Ray workers.

    reward = build_reward(cfg.reward, task)          # InlineReward (workers = 0) or RewardPool
    rewards = reward.score(problems, texts, finished)      # a whole batch at once

    # RewardPool only: completions go to the pool as they finish, scoring overlaps generation
    engine.generate(prompts, params, seed,
                    on_complete=lambda i, c: pool.submit(i, problems[i], decode(c), c.finished))
    verdicts = pool.collect(len(prompts))                  # in index order

    reward.metrics()   # since the last call: reward/latency_s_p50|p99, reward/queue_depth,
                       # reward/busy_s, reward/<kind>/<reason> counts, reward/error_frac,
                       # RM-vs-verifier agreement

A verdict with reason "reward_error" (the user's function raised or returned a non-number)
counts towards reward/error_frac; the first time an error is seen (by its last traceback
line) its traceback goes to ``log`` at level "error", so a run that fails on every sample
logs once, not once per sample.

A submit past ``max_in_flight`` waits for a result first (back-pressure: the generating
thread blocks inside on_complete). Latency runs from submit to the worker's end of scoring,
so in the inline case it includes the wait behind the rest of the batch.
"""

from __future__ import annotations

import os
import statistics
import time
from collections import Counter

import numpy as np

from engine import metrics as M
from engine.reward.verdict import Judge, Verdict
from engine.tasks.base import Problem, Task

SANDBOX_REASONS = {"pass": "pass", "wrong_answer": "wrong_answer", "crash": "crash",
                   "timeout": "timeout", "limit_exceeded": "limit"}


ERRORS_LOGGED = 20     # distinct reward errors logged per service; later ones are counted


class RewardService:
    """Scoring statistics shared by the inline scorer and the pool."""

    streaming = False

    def __init__(self, kind: str, log=None):
        self.kind, self.log = kind, log
        self.errors_seen: set[str] = set()
        self._reset()

    def _reset(self) -> None:
        self.latencies: list[float] = []
        self.depths: list[int] = []
        self.busy_s = 0.0
        self.reasons: Counter[str] = Counter()
        self.pairs: list[tuple[float, float]] = []          # (rm score, verifier reward)

    def record(self, v: Verdict, submitted: float, started: float, ended: float) -> None:
        self.latencies.append(ended - submitted)
        self.busy_s += ended - started
        self.reasons[SANDBOX_REASONS.get(v.reason, v.reason) if self.kind == "sandbox"
                     else v.reason] += 1
        if v.verifier is not None:
            self.pairs.append((v.reward, v.verifier))
        if v.reason == "reward_error":
            self._log_error(v.detail or "no traceback")

    def _log_error(self, detail: str) -> None:
        from engine.reward.user_function import error_key

        key = error_key(detail)
        if key in self.errors_seen or self.log is None:
            return
        self.errors_seen.add(key)
        if len(self.errors_seen) <= ERRORS_LOGGED:
            more = ("" if len(self.errors_seen) < ERRORS_LOGGED else
                    "\n(further distinct reward errors are counted in reward/error_frac, "
                    "not logged)")
            self.log(f"reward function error (scored 0, reason reward_error; logged once "
                     f"per distinct error):\n{detail}{more}", level="error")

    def metrics(self) -> dict[str, float]:
        if not self.latencies:
            return {}
        p50, p99 = np.percentile(np.asarray(self.latencies), [50, 99])
        out = {M.REWARD_LATENCY_S_P50: float(p50), M.REWARD_LATENCY_S_P99: float(p99),
               M.REWARD_QUEUE_DEPTH: statistics.fmean(self.depths) if self.depths else 0.0,
               M.REWARD_QUEUE_DEPTH_MAX: float(max(self.depths, default=0)),
               M.REWARD_BUSY_S: self.busy_s,
               M.REWARD_ERROR_FRAC: self.reasons["reward_error"] / len(self.latencies)}
        names = set(SANDBOX_REASONS.values()) if self.kind == "sandbox" else set()
        for reason in names | set(self.reasons):
            out[M.REWARD_OUTCOMES.of(kind=self.kind, reason=reason)] = float(self.reasons[reason])
        if self.pairs:
            rm = np.asarray([p[0] for p in self.pairs])
            ok = np.asarray([p[1] for p in self.pairs]) == 1.0
            out[M.REWARD_RM_MEAN] = float(rm.mean())
            out[M.REWARD_VERIFIER_MEAN] = float(np.mean([p[1] for p in self.pairs]))
            out[M.REWARD_RM_VS_VERIFIER_AGREEMENT] = float(((rm > 0.5) == ok).mean())
        self._reset()
        return out

    def score(self, problems: list[Problem], texts: list[str],
              finished: list[bool]) -> list[float]:
        return [v.reward for v in self.verdicts(problems, texts, finished)]


class InlineReward(RewardService):
    """Scores a batch in the calling process, one completion after another."""

    def __init__(self, judge: Judge, log=None):
        super().__init__(judge.kind, log)
        self.judge = judge

    def verdicts(self, problems: list[Problem], texts: list[str],
                 finished: list[bool]) -> list[Verdict]:
        submitted, out = time.time(), []
        for i, (p, t, f) in enumerate(zip(problems, texts, finished, strict=True)):
            self.depths.append(len(texts) - i)
            start = time.time()
            v = self.judge.judge(p, t, f)
            self.record(v, submitted, start, time.time())
            out.append(v)
        return out


class RewardWorker:
    """A pool member (a Ray actor): builds its own judge and scores one completion per
    call, reporting when it started and ended."""

    def __init__(self, reward_cfg, task: Task, rm_server=None):
        from engine.reward import build_judge

        self.judge = build_judge(reward_cfg, task, rm_server)

    def placement_group(self) -> str | None:
        """The placement group this actor runs in (the run's, when its rollout worker is
        placed in one: child actors are captured into it)."""
        import ray

        return ray.get_runtime_context().get_placement_group_id()

    def score(self, problem: Problem, text: str, finished: bool) -> tuple[Verdict, float, float]:
        start = time.time()
        v = self.judge.judge(problem, text, finished)
        return v, start, time.time()


class RewardPool(RewardService):
    """``workers`` RewardWorker actors; submit() as completions finish, collect() at the end."""

    streaming = True

    def __init__(self, kind: str, reward_cfg, task: Task, rm_server=None, log=None):
        import ray

        super().__init__(kind, log)
        ensure_ray()
        # The actor mostly waits on its sandboxed child, which its own rlimits bound; it
        # reserves no CPU so that a pool never starves the rollout and learner of theirs.
        actor = ray.remote(num_cpus=0)(RewardWorker)
        self.workers = [actor.remote(reward_cfg, task, rm_server)
                        for _ in range(reward_cfg.workers)]
        self.placement_groups = set(ray.get([w.placement_group.remote()
                                             for w in self.workers]))
        self.max_in_flight = reward_cfg.max_in_flight
        self.load = [0] * len(self.workers)
        self.in_flight: dict = {}                       # ref -> (index, worker, submitted)
        self.done: dict[int, Verdict] = {}

    def submit(self, i: int, problem: Problem, text: str, finished: bool) -> None:
        self._settle(wait_for_one=False)
        self.depths.append(len(self.in_flight))
        while len(self.in_flight) >= self.max_in_flight:
            self._settle(wait_for_one=True)
        w = min(range(len(self.workers)), key=self.load.__getitem__)
        ref = self.workers[w].score.remote(problem, text, finished)
        self.load[w] += 1
        self.in_flight[ref] = (i, w, time.time())

    def _settle(self, wait_for_one: bool) -> None:
        """Record every finished result; with ``wait_for_one``, block until one is."""
        import ray

        if not self.in_flight:
            return
        refs = list(self.in_flight)
        if wait_for_one:
            ray.wait(refs, num_returns=1)
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in ready:
            i, w, submitted = self.in_flight.pop(ref)
            self.load[w] -= 1
            v, start, end = ray.get(ref)
            self.record(v, submitted, start, end)
            self.done[i] = v

    def collect(self, n: int) -> list[Verdict]:
        """Waits for every submitted completion; verdicts for indices 0..n-1 in order."""
        while self.in_flight:
            self._settle(wait_for_one=True)
        out = [self.done.pop(i) for i in range(n)]
        if self.done:
            raise ValueError(f"collect({n}) left verdicts for indices {sorted(self.done)}")
        return out

    def verdicts(self, problems: list[Problem], texts: list[str],
                 finished: list[bool]) -> list[Verdict]:
        for i, (p, t, f) in enumerate(zip(problems, texts, finished, strict=True)):
            self.submit(i, p, t, f)
        return self.collect(len(texts))

    def close(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w)
        self.workers = []


def ensure_ray() -> None:
    """Join the Ray cluster a job runs in (RAY_ADDRESS), or start a local one."""
    import ray

    if not ray.is_initialized():
        # "local" starts a private instance: a bare ray.init() would follow a stale
        # /tmp/ray/ray_current_cluster to a head that may be long gone.
        ray.init(address=os.environ.get("RAY_ADDRESS", "local"), include_dashboard=False,
                 log_to_driver=False)
