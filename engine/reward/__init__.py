"""The reward seam. A reward scores a batch of completions of problems; a judge scores one.

    reward = build_reward(cfg.reward, task, log)   # RewardFn: .verdicts(problems, texts, finished)
      rule          RuleVerifier      exact / numeric / the task's verifier, + format check
      sandbox       SandboxVerifier   run the program against unit tests (engine/reward/sandbox.py)
      reward_model  RewardModelJudge  served classifier (engine/reward/model.py), verifier alongside
      math          MathVerifier      math-verify extraction + equivalence
                                      (engine/reward/math_answer.py)
      python        PythonRewardJudge the user's fn(prompt, completion, answer, **row)
                                      (engine/reward/user_function.py)
    workers = 0 -> InlineReward (after generation, in process)
    workers > 0 -> RewardPool (Ray actors; .streaming: submit as completions finish, collect)

Every judge returns a Verdict (reward + reason); the service turns them into reward/*
metrics (engine/reward/service.py), reward/error_frac among them, and logs the traceback
of each distinct reward_error once through ``log``.
"""

from __future__ import annotations

from typing import Protocol

from engine import metrics as M
from engine.config import (
    MathRewardConfig,
    PythonRewardConfig,
    RewardModelConfig,
    RuleRewardConfig,
    SandboxRewardConfig,
)
from engine.reward.verdict import Judge, Verdict
from engine.tasks.base import Problem, Task

__all__ = ["Judge", "RewardFn", "Verdict", "build_judge", "build_reward", "reward_metrics",
           "service_metrics"]


class RewardFn(Protocol):
    def verdicts(self, problems: list[Problem], texts: list[str],
                 finished: list[bool]) -> list[Verdict]:
        """One Verdict (reward + the judge's reason) per completion, in order."""

    def score(self, problems: list[Problem], texts: list[str],
              finished: list[bool]) -> list[float]:
        """The rewards of ``verdicts``."""


def verifier_for(task: Task) -> Judge:
    """The task's own verifier: execution for programs, the exact rule otherwise."""
    from engine.tasks.code import CodeTask

    if isinstance(task, CodeTask):
        from engine.reward.execution import SandboxVerifier

        return SandboxVerifier(SandboxRewardConfig(), task)
    from engine.reward.rules import RuleVerifier

    return RuleVerifier(RuleRewardConfig(), task)


def build_judge(cfg, task: Task, rm_server=None) -> Judge:
    if isinstance(cfg, SandboxRewardConfig):
        from engine.reward.execution import SandboxVerifier

        return SandboxVerifier(cfg, task)
    if isinstance(cfg, RewardModelConfig):
        from engine.reward.model import RewardModelJudge

        return RewardModelJudge(verifier_for(task), rm_server)
    if isinstance(cfg, MathRewardConfig):
        from engine.reward.math_answer import MathVerifier

        return MathVerifier(cfg, task)
    if isinstance(cfg, PythonRewardConfig):
        from engine.reward.user_function import PythonRewardJudge

        return PythonRewardJudge(cfg, task)
    from engine.reward.rules import RuleVerifier

    return RuleVerifier(cfg, task)


def build_reward(cfg, task: Task, log=print) -> RewardFn:
    """The reward a run's config asks for. A reward model is trained (cached) and served
    first, and its held-out agreement with the verifier is logged. ``log(message,
    level=...)`` also gets each distinct reward_error's traceback, once."""
    from engine.reward.service import InlineReward, RewardPool

    server = None
    if isinstance(cfg, RewardModelConfig):
        import ray

        from engine.reward.model import ensure_reward_model, heldout_agreement, start_server

        server = start_server(ensure_reward_model(cfg, task.cfg), cfg)
        fit = heldout_agreement(task, lambda pairs: ray.get(
            [server.score.remote(p, t) for p, t in pairs]))
        log(f"reward model: held-out Pearson r = {fit['pearson_r']:.2f} with the verifier, "
            f"agreement {fit['agreement']:.2f} over {fit['n']:.0f} examples")
    judge = build_judge(cfg, task, server)
    if cfg.workers == 0:
        return InlineReward(judge, log)
    pool = RewardPool(judge.kind, cfg, task, server, log)
    groups = sorted(pg or "none" for pg in pool.placement_groups)
    log(f"reward pool: {cfg.workers} Ray worker(s) in placement group(s) {', '.join(groups)}")
    return pool


def service_metrics(reward: RewardFn) -> dict[str, float]:
    """A reward service's latency, queue and outcome metrics since the last call ({} for a
    plain scorer). Each rollout worker asks its own."""
    metrics = getattr(reward, "metrics", None)        # a service, or a fault wrapping one
    return metrics() if callable(metrics) else {}


def reward_metrics(per_worker: list[dict[str, float]],
                   step_metrics: dict[str, float]) -> dict[str, float]:
    """reward/share (the reward phase's part of the step's wall time) and the services'
    metrics of every rollout worker, merged: outcome counts and busy time add up, p99 and
    maxima take the worst worker, the rest are averaged."""
    out = {M.REWARD_SHARE: step_metrics[M.TIME_REWARD_S] / step_metrics[M.TIME_STEP_S]}
    for key in {k for m in per_worker for k in m}:
        values = [m[key] for m in per_worker if key in m]
        if key == M.REWARD_BUSY_S or key.count("/") == 2:           # reward/<kind>/<reason>
            out[key] = float(sum(values))
        elif key.endswith(("_p99", "_max")):
            out[key] = float(max(values))
        else:
            out[key] = float(sum(values) / len(values))
    return out
