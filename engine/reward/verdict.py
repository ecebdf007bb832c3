"""What scoring one completion yields, and the judge seam that yields it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from engine.tasks.base import Problem


@dataclass(frozen=True)
class Verdict:
    reward: float
    reason: str                     # e.g. "correct", "format", "pass", "timeout"
    verifier: float | None = None   # the verifier's reward where a learned RM set .reward
    detail: str | None = None       # reason "reward_error": the user function's traceback


class Judge(Protocol):
    kind: str                       # "rule", "sandbox", "math", "python": names the metrics

    def judge(self, problem: Problem, text: str, finished: bool) -> Verdict: ...
