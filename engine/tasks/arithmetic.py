"""Integer arithmetic: ``12*34=`` -> ``408``. Operands have min..max digits."""

from __future__ import annotations

import random
import re

from engine.config import ArithmeticTaskConfig
from engine.tasks.base import Problem, Task

_INT = re.compile(r"-?\d+")
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


class ArithmeticTask(Task):
    name = "arithmetic"

    def __init__(self, cfg: ArithmeticTaskConfig):
        super().__init__()
        self.cfg = cfg
        self.seed, self.eval_size, self.format_penalty = cfg.seed, cfg.eval_size, cfg.format_penalty

    def _operand(self, rng: random.Random) -> int:
        digits = rng.randint(self.cfg.min_digits, self.cfg.max_digits)
        lo = 0 if digits == 1 else 10 ** (digits - 1)
        return rng.randint(lo, 10**digits - 1)

    def draw(self, rng: random.Random) -> Problem:
        op = rng.choice(self.cfg.ops)
        a, b = self._operand(rng), self._operand(rng)
        return Problem(prompt=f"{a}{op}{b}=", answer=str(_OPS[op](a, b)))

    def is_correct(self, problem: Problem, text: str) -> bool | None:
        if not _INT.fullmatch(text):
            return None
        return int(text) == int(problem.answer)
