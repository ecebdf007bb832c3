import random

import numpy as np

from engine.config import ArithmeticTaskConfig, LongTailTaskConfig
from engine.tasks import ArithmeticTask, Problem, ReverseTask


def test_train_stream_never_contains_a_held_out_problem():
    task = ArithmeticTask(ArithmeticTaskConfig(max_digits=1, eval_size=64))
    held_out = {p.prompt for p in task.eval_problems()}
    assert len(held_out) == 64
    for step in range(20):
        assert not held_out & {p.prompt for p in task.train_problems(step, 32)}


def test_problem_draws_are_a_function_of_the_seed_and_step():
    a = ArithmeticTask(ArithmeticTaskConfig(seed=7))
    b = ArithmeticTask(ArithmeticTaskConfig(seed=7))
    c = ArithmeticTask(ArithmeticTaskConfig(seed=8))
    assert a.train_problems(3, 16) == b.train_problems(3, 16)
    assert a.eval_problems() == b.eval_problems()
    assert a.train_problems(3, 16) != c.train_problems(3, 16)
    assert a.train_problems(3, 16) != a.train_problems(4, 16)
    assert a.train_problems(3, 16, stream="sft") != a.train_problems(3, 16)


def test_arithmetic_answers_are_exact_integers():
    task = ArithmeticTask(ArithmeticTaskConfig())
    for p in task.train_problems(0, 200):
        a, op, b = _split(p.prompt)
        assert int(p.answer) == {"+": a + b, "-": a - b, "*": a * b}[op]


def _split(prompt: str) -> tuple[int, str, int]:
    body = prompt.rstrip("=")
    for i, ch in enumerate(body[1:], start=1):
        if ch in "+-*":
            return int(body[:i]), ch, int(body[i + 1:])
    raise AssertionError(prompt)


def test_arithmetic_reward_is_one_zero_or_the_format_penalty():
    task = ArithmeticTask(ArithmeticTaskConfig(format_penalty=0.25))
    p = Problem("12-34=", "-22")
    assert task.score(p, "-22", finished=True) == 1.0
    assert task.score(p, "22", finished=True) == 0.0
    assert task.score(p, "-2a", finished=True) == -0.25     # not an integer
    assert task.score(p, "", finished=True) == -0.25        # EOS straight away
    assert task.score(p, "-22", finished=False) == -0.25    # ran out of budget


def test_reverse_lengths_are_heavy_tailed():
    task = ReverseTask(LongTailTaskConfig())
    rng = random.Random(0)
    target_tokens = np.array([task.draw_length(rng) + 1 for _ in range(20_000)])   # + EOS
    p50, p99 = np.percentile(target_tokens, [50, 99])
    assert p99 / p50 >= 8, (p50, p99)


def test_reverse_reward():
    task = ReverseTask(LongTailTaskConfig())
    p = Problem("rev:abc=", "cba")
    assert task.score(p, "cba", True) == 1.0
    assert task.score(p, "abc", True) == 0.0
    assert task.score(p, "c1", True) == -0.1
    assert task.score(p, "cba", False) == -0.1
