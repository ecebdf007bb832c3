"""The execution verifier: run the completion against the task's unit tests in the sandbox.

    unfinished -> -format_penalty "unfinished" (never run)
    run_tests(text, task.tests(problem), limits).reason
        pass -> 1.0   wrong_answer -> 0.0   crash / timeout / limit_exceeded -> -format_penalty
"""

from __future__ import annotations

from engine.config import SandboxRewardConfig
from engine.reward.sandbox import Limits, require_isolation, run_tests
from engine.reward.verdict import Verdict
from engine.tasks.base import Problem
from engine.tasks.code import CodeTask


def limits_of(cfg: SandboxRewardConfig) -> Limits:
    return Limits(timeout_s=cfg.timeout_s, cpu_s=cfg.cpu_s, memory_mb=cfg.memory_mb,
                  file_size_kb=cfg.file_size_kb, max_processes=cfg.max_processes,
                  output_kb=cfg.output_kb)


class SandboxVerifier:
    kind = "sandbox"

    def __init__(self, cfg: SandboxRewardConfig, task: CodeTask):
        require_isolation()          # at start: no run scores programs it cannot contain
        self.task, self.limits = task, limits_of(cfg)

    def judge(self, problem: Problem, text: str, finished: bool) -> Verdict:
        if not finished:
            return Verdict(-self.task.format_penalty, "unfinished")
        reason = run_tests(text, self.task.tests(problem), self.limits).reason
        reward = {"pass": 1.0, "wrong_answer": 0.0}.get(reason, -self.task.format_penalty)
        return Verdict(reward, reason)
