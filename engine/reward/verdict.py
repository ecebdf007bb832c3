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


class Judge(Protocol):
    kind: str                       # "rule" or "sandbox": names the outcome metrics

    def judge(self, problem: Problem, text: str, finished: bool) -> Verdict: ...
