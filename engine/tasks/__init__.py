"""Tasks: problem streams with a held-out split and an exact verifier.

    task = build_task(cfg.task)
    task.train_problems(step, n)   # deterministic in (task seed, step); never an eval item
    task.eval_problems()           # fixed held-out split from the task seed
    task.score(problem, text, finished) -> reward
"""

from __future__ import annotations

from engine.config import ArithmeticTaskConfig, CodeTaskConfig, LongTailTaskConfig
from engine.tasks.arithmetic import ArithmeticTask
from engine.tasks.base import Problem, Task
from engine.tasks.code import CodeTask
from engine.tasks.reverse import ReverseTask

__all__ = ["ArithmeticTask", "CodeTask", "Problem", "ReverseTask", "Task", "build_task"]


def build_task(cfg: ArithmeticTaskConfig | LongTailTaskConfig | CodeTaskConfig) -> Task:
    if isinstance(cfg, ArithmeticTaskConfig):
        return ArithmeticTask(cfg)
    if isinstance(cfg, CodeTaskConfig):
        return CodeTask(cfg)
    return ReverseTask(cfg)
