"""A multi-turn task: problems drawn by an environment, trajectories scored by its steps.

    task = EnvTask(cfg.task)                 the environment's class from task.env.class
    task.train_problems / eval_problems      rows from env.draw(rng), as any task's
    problem.prompt                           the rendering of env.reset(row)
    task.new_env()                           a fresh environment for one trajectory
    task.demonstration_turns(problem)        the environment's worked trajectory, for the
                                             warm start: (text, trained) per message
                                             (demonstration_messages: as messages)
"""

from __future__ import annotations

import hashlib
import random

from engine.config import EnvTaskConfig
from engine.config.datafile import resolve
from engine.config.reward import is_file_target
from engine.envs import env_class
from engine.envs.base import Message, render
from engine.tasks.base import Problem, Task


class EnvTask(Task):
    def __init__(self, cfg: EnvTaskConfig):
        super().__init__()
        self.cfg, self.seed, self.eval_size = cfg, cfg.seed, cfg.eval_size
        self.name, self.format_penalty = f"env:{cfg.env.class_}", 0.0
        self.env_cls = env_class(cfg.env)
        self.law = self.new_env()         # draws rows and renders their prompts
        self.stop: tuple[str, ...] = tuple(getattr(self.env_cls, "stop", ()))
        self._demo_rng = random.Random(f"{cfg.seed}:demo")

    def new_env(self):
        return self.env_cls(**self.cfg.env.args)

    def draw(self, rng: random.Random) -> Problem:
        row = self.law.draw(rng)
        return Problem(prompt=render(self.law.reset(row)), answer=str(row.get("answer", "")),
                       row=row)

    def is_correct(self, problem: Problem, text: str) -> bool | None:
        """Never asked: a trajectory is scored by its environment's steps."""
        raise TypeError("an environment task's trajectories are scored by its steps")

    def demonstration_messages(self, problem: Problem) -> list[Message]:
        demo = getattr(self.law, "demonstration", None)
        if demo is None:
            raise ValueError(f"task.env.class={self.cfg.env.class_!r} has no demonstration"
                             "(row, rng) for the supervised warm start; add one, or set "
                             "warm_start.steps = 0")
        return demo(problem.row, self._demo_rng)

    def demonstration_turns(self, problem: Problem) -> list[tuple[str, bool]]:
        return [(m["content"], m["role"] == "assistant")
                for m in self.demonstration_messages(problem)]

    def opening(self, problem: Problem) -> list[Message]:
        """The messages a trajectory of ``problem`` opens with (its environment's reset)."""
        return self.law.reset(problem.row)

    def demonstration(self, problem: Problem) -> str:
        return "".join(text for text, _ in self.demonstration_turns(problem))

    def identity(self) -> dict:
        """A user's environment file by its content: the warm start imitates its
        demonstrations, so an edited file is another warm start."""
        target = self.cfg.env.class_.rpartition(":")[0]
        if not is_file_target(target):
            return {}
        return {"env_file": hashlib.sha256(resolve(target).read_bytes()).hexdigest()[:16]}
