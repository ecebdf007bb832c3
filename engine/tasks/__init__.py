"""Tasks: problem streams with a held-out split and an exact verifier.

    task = build_task(cfg.task)
    task.train_problems(step, n)   # deterministic in (task seed, step); never an eval item
    task.eval_problems()           # fixed held-out split from the task seed
    task.score(problem, text, finished) -> reward

    task = task_for(cfg, tokenizer, log)   # the run's task: a dataset task needs the run's
                                           # seed (its shuffle) and tokenizer (rendering)
"""

from __future__ import annotations

from engine.config import (
    ArithmeticTaskConfig,
    CodeTaskConfig,
    DatasetTaskConfig,
    EnvTaskConfig,
    LongTailTaskConfig,
    RunConfig,
)
from engine.tasks.arithmetic import ArithmeticTask
from engine.tasks.base import Problem, Task
from engine.tasks.code import CodeTask
from engine.tasks.reverse import ReverseTask

__all__ = ["ArithmeticTask", "CodeTask", "Problem", "ReverseTask", "Task", "build_task",
           "task_for"]


def task_for(cfg: RunConfig, tokenizer, log=None) -> Task:
    """The task of a run. ``log`` (given where the run's log should say it once) gets the
    dataset's summary: rows, held-out prompts, prompts dropped as too long."""
    if isinstance(cfg.task, DatasetTaskConfig):
        from engine.tasks.dataset import DatasetTask

        return DatasetTask(cfg.task, tokenizer, seed=cfg.model.seed, log=log)
    return build_task(cfg.task)


def build_task(cfg: ArithmeticTaskConfig | LongTailTaskConfig | CodeTaskConfig
               | EnvTaskConfig) -> Task:
    """A synthetic task from its config alone (a dataset needs the run: task_for)."""
    if isinstance(cfg, DatasetTaskConfig):
        raise TypeError("a dataset task is built with task_for(run config, tokenizer)")
    if isinstance(cfg, EnvTaskConfig):
        from engine.tasks.env import EnvTask

        return EnvTask(cfg)
    if isinstance(cfg, ArithmeticTaskConfig):
        return ArithmeticTask(cfg)
    if isinstance(cfg, CodeTaskConfig):
        return CodeTask(cfg)
    return ReverseTask(cfg)
