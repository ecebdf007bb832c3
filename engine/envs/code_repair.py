"""The built-in code-repair environment: fix a small buggy program until its tests pass.

In the built-in model's alphabet (digits, + - * = :, a-z, space), one trajectory reads

    f=lambda x:x*2+4 7=17 -3=-3:       the prompt (reset): the buggy program, then its
                                       tests as input=expected, ':' hands over the turn
    f=lambda x:x*2+4<eos>              the model's turn: a whole program
    fail 7 got 18 want 17:             the observation: the first failing test's output
                                       (or "error <kind>:" when the program does not run)
    f=lambda x:x*2+3<eos>              the next turn; every test passes: reward 1, done

Programs run in the code sandbox the sandbox reward uses (engine.reward.sandbox: bubblewrap,
no network, its own uid, rlimits), never in this process: the expected values come from
the task's spec (engine.tasks.code.spec_value), not from running the correct program. A
step is a sandbox run (~30 ms here), on the env call's own thread, under
task.env.step_timeout_s like any step. Each failed attempt costs ``attempt_cost`` (a
per-turn reward: 0 by default, the trajectory's reward is then 1 or 0).
"""

from __future__ import annotations

import random
import re
from typing import Any

from engine.envs.base import Message, StepResult
from engine.reward.sandbox import Limits, require_isolation, run_tests
from engine.tasks.code import _SYMBOL, spec_value

_KIND = re.compile(r"[^a-z ]")


class CodeRepairEnv:
    stop = ()

    def __init__(self, ops: str = "asm", max_terms: int = 2, max_const: int = 9,
                 tests: int = 3, attempt_cost: float = 0.0, demo_fail_frac: float = 0.3,
                 timeout_s: float = 2.0):
        names = {"a": "add", "s": "sub", "m": "mul"}
        if not ops or set(ops) - set(names):
            raise ValueError(f"ops={ops!r}: use some of a (add), s (sub), m (mul)")
        if max_const < 2:
            raise ValueError(f"max_const={max_const}: a bug changes a constant, so use >= 2")
        require_isolation()        # at start: no run executes programs it cannot contain
        self.ops = [names[o] for o in ops]
        self.max_terms, self.max_const, self.n_tests = max_terms, max_const, tests
        self.attempt_cost, self.demo_fail_frac = attempt_cost, demo_fail_frac
        self.limits = Limits(timeout_s=timeout_s)
        self.tests: list[tuple[int, int]] = []

    def draw(self, rng: random.Random) -> dict[str, Any]:
        terms = [(rng.choice(self.ops), rng.randint(1, self.max_const))
                 for _ in range(rng.randint(1, self.max_terms))]
        spec = "".join(f"{op}{c}" for op, c in terms)
        k = rng.randrange(len(terms))                     # the bug: one constant is off
        op, c = terms[k]
        wrong = rng.choice([v for v in range(1, self.max_const + 1) if v != c])
        buggy = terms[:k] + [(op, wrong)] + terms[k + 1:]
        wrong_spec = "".join(f"{o}{v}" for o, v in buggy)
        while True:                  # the tests tell the bug apart (one input is enough)
            inputs = rng.sample(range(-9, 10), self.n_tests)
            if any(spec_value(spec, x) != spec_value(wrong_spec, x) for x in inputs):
                break
        return {"spec": spec, "answer": program(terms), "buggy": program(buggy),
                "tests": [[x, spec_value(spec, x)] for x in inputs]}

    def reset(self, row: dict[str, Any]) -> list[Message]:
        self.tests = [(x, y) for x, y in row["tests"]]
        shown = " ".join(f"{x}={y}" for x, y in self.tests)
        return [{"role": "user", "content": f"{row['buggy']} {shown}:"}]

    def step(self, text: str) -> StepResult:
        result = run_tests(text, self.tests, self.limits)
        if result.reason == "pass":
            return StepResult([], 1.0, True, {"reason": "pass", "tool_call": True})
        return StepResult([{"role": "tool", "content": self.failure(result)}],
                          -self.attempt_cost, False, {"reason": result.reason,
                                                      "tool_call": True})

    def failure(self, result) -> str:
        """The observation of a failed run: the first failing test's output, or the error
        kind when none ran (in the model's alphabet: lower-case letters only)."""
        if result.reason == "wrong_answer":
            i = result.passed.index(False)
            x, want = self.tests[i]
            got = result.outputs[i]
            got = got if isinstance(got, int) else "none"
            return f"fail {x} got {got} want {want}:"
        kind = result.detail.partition(":")[2] or result.reason
        return f"error {_KIND.sub('', kind.lower())}:"

    def demonstration(self, row: dict[str, Any], rng: random.Random) -> list[Message]:
        """The fix; in ``demo_fail_frac`` of them first the buggy program again, its
        failure, then the fix (the expected values are the spec's)."""
        fix = {"role": "assistant", "content": row["answer"]}
        if rng.random() >= self.demo_fail_frac:
            return [fix]
        buggy = spec_of(row["buggy"])
        seen = next((f"fail {x} got {spec_value(buggy, x)} want {y}:"
                     for x, y in row["tests"] if spec_value(buggy, x) != y), None)
        if seen is None:                      # the bug changes no test's value
            return [fix]
        return [{"role": "assistant", "content": row["buggy"]},
                {"role": "tool", "content": seen}, fix]


def program(terms: list[tuple[str, int]]) -> str:
    return "f=lambda x:x" + "".join(f"{_SYMBOL[op]}{c}" for op, c in terms)


def spec_of(source: str) -> str:
    """The spec of a program this module wrote (``f=lambda x:x*2+4`` -> ``mul2add4``)."""
    names = {v: k for k, v in _SYMBOL.items()}
    return "".join(f"{names[op]}{c}" for op, c in re.findall(r"([+\-*])(\d+)", source))
