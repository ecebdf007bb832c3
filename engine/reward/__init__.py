"""The reward seam. A reward function scores a batch of completions of problems.

The rule verifier is the task's own exact checker; the code sandbox and the served reward
model plug in behind the same protocol.
"""

from __future__ import annotations

from typing import Protocol

from engine.config import RuleRewardConfig
from engine.tasks.base import Problem, Task


class RewardFn(Protocol):
    def score(self, problems: list[Problem], texts: list[str],
              finished: list[bool]) -> list[float]: ...


class RuleReward:
    def __init__(self, task: Task):
        self.task = task

    def score(self, problems: list[Problem], texts: list[str],
              finished: list[bool]) -> list[float]:
        return [self.task.score(p, t, f) for p, t, f in zip(problems, texts, finished, strict=True)]


def build_reward(cfg: RuleRewardConfig, task: Task) -> RewardFn:
    return RuleReward(task)
