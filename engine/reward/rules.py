"""Deterministic rule verifiers: each turns (problem, completion) into a reward and a reason.

    unfinished (no EOS in budget)     -> -format_penalty   "unfinished"
    format_regex does not fullmatch   -> -format_penalty   "format"
    match = "task"     the task's own verifier (None = malformed -> "format")
    match = "exact"    text == answer                      "correct" / "wrong"
    match = "numeric"  |float(text) - float(answer)| <= tolerance
"""

from __future__ import annotations

import re

from engine.config import RuleRewardConfig
from engine.reward.verdict import Verdict
from engine.tasks.base import Problem, Task


class RuleVerifier:
    kind = "rule"

    def __init__(self, cfg: RuleRewardConfig, task: Task):
        self.cfg, self.task = cfg, task
        self.format = re.compile(cfg.format_regex) if cfg.format_regex is not None else None

    def judge(self, problem: Problem, text: str, finished: bool) -> Verdict:
        penalty = -self.task.format_penalty
        if not finished:
            return Verdict(penalty, "unfinished")
        if self.format is not None and not self.format.fullmatch(text):
            return Verdict(penalty, "format")
        ok = self._correct(problem, text)
        if ok is None:
            return Verdict(penalty, "format")
        return Verdict(1.0, "correct") if ok else Verdict(0.0, "wrong")

    def _correct(self, problem: Problem, text: str) -> bool | None:
        if self.cfg.match == "task":
            return self.task.is_correct(problem, text)
        if self.cfg.match == "exact":
            return text == problem.answer
        try:
            return abs(float(text) - float(problem.answer)) <= self.cfg.tolerance
        except ValueError:
            return None
