"""Samples and the experience buffer that joins rollout + reward to the learner.

    rollout -> Sample(prompt, response, behaviour logprobs, version) -> reward fills .reward
            -> buffer.put(group) ... learner: buffer.take(n_groups, learner_version)

A multi-turn trajectory (task.type = "env") is one sample too: its response is the model's
turns with the environment's observations between them, and ``loss_mask`` says which
response tokens the model sampled (1) and which it was handed (0: no loss, no KL, no
entropy, no logprob gap).

A sample keeps the policy version that generated it; staleness at update time is
learner_version - sample.version, checked against the policy's bound every step. A
partial rollout continued under newer weights mixes versions: ``version`` is then the
oldest (its staleness), ``last_version`` the newest. Groups (the group_size completions
of one prompt) enter and leave the buffer whole: GRPO normalizes advantages in a group.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from engine.config import NoOverlongConfig, OverlongConfig, OverlongPenaltyConfig
from engine.tasks.base import Problem


@dataclass
class TurnRecord:
    """One model turn of a trajectory: its response tokens [start, end), the policy
    version that generated it, and the reward of the environment step that answered it
    (0.0 when none did: a turn cut by its budget)."""
    start: int
    end: int
    version: int
    reward: float = 0.0


@dataclass
class EnvTrace:
    """What one trajectory's environment did (engine.rollout.multiturn fills it)."""
    turns: int = 0                    # model turns taken
    turn_log: list[TurnRecord] = field(default_factory=list)   # each of them, in order
    step_s: list[float] = field(default_factory=list)   # each reset / step call, seconds
    errors: int = 0                   # calls that raised
    timeouts: int = 0                 # calls still running at task.env.step_timeout_s
    tool_calls: int = 0               # steps whose info said "tool_call"


@dataclass
class Sample:
    problem: Problem
    prompt_ids: list[int]
    response_ids: list[int]
    behaviour_logprobs: list[float]   # per response token, from the rollout engine
    finished: bool                    # EOS inside the budget
    version: int                      # (oldest) policy version that generated it
    group: int                        # index of its prompt group within the step
    text: str = ""
    reward: float = 0.0
    reason: str = ""                  # the judge's word on it ("correct", "timeout", ...)
    advantage: float = 0.0
    last_version: int | None = None   # newest version, when continued under new weights
    recycled: int = 0                 # steps it was carried over unfinished
    shaping: float = 0.0              # added to reward for advantages (overlong penalty)
    in_loss: bool = True              # False: masked out of the loss (overlong filter)
    gen_s: float | None = None        # its generate call's start -> its completion (seconds)
    # rollout.record_routing: experts per fed token (prompt + response[:-1], L, k), int16
    routing: np.ndarray | None = None
    # per response token: 1 sampled by the policy, 0 an observation; None: all sampled
    loss_mask: list[int] | None = None
    env: EnvTrace | None = None       # a trajectory's environment record (task.type "env")
    # per-token credit, (response index, reward): rewards PPO's GAE places there instead of
    # on the last sampled token, which keeps learning_reward minus their sum; None: none
    # (task.env.reward_credit = "turn" sets each turn's step reward at its last token)
    credit: list[tuple[int, float]] | None = None

    @property
    def learning_reward(self) -> float:
        """What advantages and dynamic sampling see: the reward plus its shaping."""
        return self.reward + self.shaping

    @property
    def mixes_versions(self) -> bool:
        return self.last_version is not None and self.last_version != self.version


def zero_variance(group: list[Sample]) -> bool:
    """A group whose learning rewards all agree: every group-relative advantage is 0."""
    rewards = [s.learning_reward for s in group]
    return max(rewards) == min(rewards)


def overlong_penalty(length: int, max_tokens: int, buffer_len: int, factor: float) -> float:
    """DAPO's soft overlong punishment: 0 up to max_tokens - buffer_len tokens, then
    falling linearly to -factor at max_tokens."""
    excess = length - (max_tokens - buffer_len)
    return min(-excess / buffer_len * factor, 0.0)


def apply_overlong(group: list[Sample], overlong: OverlongConfig, max_tokens: int) -> None:
    """algorithm.overlong on a scored group: the soft penalty goes into ``shaping``, the
    filter takes truncated samples out of the loss (they keep their place in the group)."""
    if isinstance(overlong, NoOverlongConfig):
        return
    for s in group:
        if isinstance(overlong, OverlongPenaltyConfig):
            s.shaping = overlong_penalty(len(s.response_ids), max_tokens, overlong.buffer_len,
                                         overlong.penalty_factor)
        else:
            s.in_loss = s.finished


class StalenessError(RuntimeError):
    """A sample newer than the learner (a versioning bug) or older than the bound."""


def check_staleness(samples: list[Sample], learner_version: int) -> list[int]:
    """Per-sample staleness at update time; raises when one is negative (a version counter
    went backwards: nothing downstream can be trusted). Over the policy's bound is the
    loop's to report: an error event and staleness/max, on which an alert fires."""
    stale = [learner_version - s.version for s in samples]
    if min(stale) < 0:
        raise StalenessError(f"negative staleness {min(stale)}: a sample claims version "
                             f"{learner_version - min(stale)} but the learner is at "
                             f"{learner_version}")
    return stale


def over_bound(staleness: list[int], bound: int, policy: str, step: int) -> str:
    """The loop's error line when samples over the policy's bound were trained on (they
    are, and shown, and alerted on: dropping them would hide the bug); "" otherwise."""
    if max(staleness) <= bound:
        return ""
    return (f"step {step}: staleness {max(staleness)} exceeds the bound {bound} of "
            f"async_policy {policy!r}")


class ExperienceBuffer:
    """FIFO of whole groups, with an optional staleness bound enforced at take time."""

    def __init__(self, max_staleness: int | None = None):
        self.max_staleness = max_staleness
        self._groups: deque[list[Sample]] = deque()
        self.dropped_stale = 0
        # told of each group dropped for staleness (the data ledger: Experience sets it)
        self.on_drop: Callable[[list[Sample]], None] | None = None

    def put(self, group: list[Sample]) -> None:
        self._groups.append(group)

    def __len__(self) -> int:
        return len(self._groups)

    def take(self, n_groups: int, learner_version: int) -> list[list[Sample]]:
        """Up to n_groups oldest groups; groups older than the staleness bound are dropped
        (and counted) instead of being trained on."""
        out: list[list[Sample]] = []
        while self._groups and len(out) < n_groups:
            g = self._groups.popleft()
            stale = learner_version - g[0].version
            if self.max_staleness is not None and stale > self.max_staleness:
                self.dropped_stale += 1
                if self.on_drop is not None:
                    self.on_drop(g)
                continue
            out.append(g)
        return out
