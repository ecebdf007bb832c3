"""The long-tail task: ``rev:abc=`` -> ``cba``, string lengths drawn from a truncated
Zipf law P(L) ~ L^-alpha, so target lengths are heavy-tailed (p99/p50 >= 8 by default:
p50 = 4 tokens, p99 = 46 with EOS). Async policies are measured on it."""

from __future__ import annotations

import bisect
import itertools
import random

from engine.config import LongTailTaskConfig
from engine.tasks.base import Problem, Task


class ReverseTask(Task):
    name = "reverse"

    def __init__(self, cfg: LongTailTaskConfig):
        super().__init__()
        self.cfg = cfg
        self.seed, self.eval_size, self.format_penalty = cfg.seed, cfg.eval_size, cfg.format_penalty
        self.lengths = list(range(cfg.min_len, cfg.max_len + 1))
        weights = [n ** -cfg.tail_alpha for n in self.lengths]
        total = sum(weights)
        self._cdf = list(itertools.accumulate(w / total for w in weights))

    def draw_length(self, rng: random.Random) -> int:
        i = bisect.bisect_left(self._cdf, rng.random())
        return self.lengths[min(i, len(self.lengths) - 1)]

    def draw(self, rng: random.Random) -> Problem:
        s = "".join(rng.choice(self.cfg.alphabet) for _ in range(self.draw_length(rng)))
        return Problem(prompt=f"rev:{s}=", answer=s[::-1])

    def is_correct(self, problem: Problem, text: str) -> bool | None:
        if not text.isalpha():
            return None
        return text == problem.answer
