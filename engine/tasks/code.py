"""The code task: write a tiny Python program from a spec; running it decides the reward.

    prompt  "mul2add3="            spec: ops on x, each with a constant, in order
    answer  "f=lambda x:x*2+3"     the canonical program (any program that passes scores)
    tests   [(x, x*2+3) for x in inputs drawn from the prompt]

The expected values are computed here from the spec (Python precedence: products first),
never by evaluating a program in this process; only the sandbox runs programs.
"""

from __future__ import annotations

import random
import re

from engine.config import CodeTaskConfig
from engine.reward.sandbox import Limits, run_tests
from engine.tasks.base import Problem, Task

_SYMBOL = {"add": "+", "sub": "-", "mul": "*"}
_TERM = re.compile(r"(add|sub|mul)(\d+)")


def spec_value(spec: str, x: int) -> int:
    """What ``x <op c> <op c> ...`` evaluates to in Python (``*`` binds tighter)."""
    terms = [x]                           # signed summands; a product extends the last one
    for op, c in _TERM.findall(spec):
        if op == "mul":
            terms[-1] *= int(c)
        else:
            terms.append(int(c) if op == "add" else -int(c))
    return sum(terms)


class CodeTask(Task):
    name = "code"
    score_threads = 4          # a score is a sandbox's run: its setup waits, not computes

    def __init__(self, cfg: CodeTaskConfig):
        super().__init__()
        self.cfg, self.limits = cfg, Limits()
        self.seed, self.eval_size, self.format_penalty = cfg.seed, cfg.eval_size, cfg.format_penalty

    def draw(self, rng: random.Random) -> Problem:
        terms = [(rng.choice(self.cfg.ops), rng.randint(1, self.cfg.max_const))
                 for _ in range(rng.randint(1, self.cfg.max_terms))]
        spec = "".join(f"{op}{c}" for op, c in terms)
        body = "x" + "".join(f"{_SYMBOL[op]}{c}" for op, c in terms)
        return Problem(prompt=f"{spec}=", answer=f"f=lambda x:{body}")

    def tests(self, problem: Problem) -> list[tuple[int, int]]:
        spec = problem.prompt.rstrip("=")
        rng = random.Random(f"{self.seed}:tests:{spec}")
        inputs = rng.sample(range(-20, 21), self.cfg.tests)
        return [(x, spec_value(spec, x)) for x in inputs]

    def is_correct(self, problem: Problem, text: str) -> bool | None:
        """Runs the program: True when every test passes, False on a wrong answer, None
        when it does not run (crash, timeout, limit)."""
        reason = run_tests(text, self.tests(problem), self.limits).reason
        return {"pass": True, "wrong_answer": False}.get(reason)
