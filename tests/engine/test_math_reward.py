"""The math verifier (math-verify): answers read from GSM8K's "#### n" line, \\boxed{},
fractions, decimals and LaTeX, compared by value; each verdict says why."""

import pytest

from engine.config import ConfigError, MathRewardConfig, validate_config
from engine.reward import build_judge
from engine.reward.math_answer import gold_answer, verdict_of
from engine.tasks.base import Problem

GSM8K = "natalia sold 48/2 = <<48/2=24>>24 clips in may\n#### 72"


@pytest.mark.parametrize("answer, completion", [
    (GSM8K, "she sold 48+24=72 clips\n#### 72"),                  # GSM8K format
    ("#### 1,234", "#### 1234"),                                  # thousands separator
    (GSM8K, "so the answer is 72"),                               # last number
    ("\\frac{1}{2}", "the answer is \\boxed{\\frac{1}{2}}"),      # boxed LaTeX
    ("\\boxed{\\dfrac{3}{4}}", "0.75"),                           # LaTeX vs decimal
    ("1/2", "$\\frac{2}{4}$"),                                    # fraction, unreduced
    ("\\sqrt{2}", "$\\sqrt 2$"),                                  # LaTeX forms
    ("#### 5", "3+4=7 7-2=5"),                                    # the last step's result
])
def test_equivalent_answers_are_correct(answer, completion):
    v = verdict_of(answer, completion, 0.1)
    assert (v.reward, v.reason) == (1.0, "correct")


@pytest.mark.parametrize("answer, completion", [
    (GSM8K, "#### 71"),
    ("\\frac{1}{2}", "\\boxed{\\frac{1}{3}}"),
    ("#### 5", "3+4=7 7-2=6"),
])
def test_different_answers_are_wrong(answer, completion):
    v = verdict_of(answer, completion, 0.1)
    assert (v.reward, v.reason) == (0.0, "wrong")


def test_a_completion_without_an_answer_is_penalized_and_a_bad_reference_is_named():
    assert reward_reason(verdict_of(GSM8K, "i do not know", 0.25)) == (-0.25, "no_answer")
    assert reward_reason(verdict_of("#### ", "42", 0.25)) == (0.0, "gold_unparsed")


def test_the_gsm8k_mark_wins_over_earlier_numbers():
    assert [str(x) for x in gold_answer(GSM8K)] == ["72", "72"]
    v = verdict_of(GSM8K, "48/2=24 then 48+24=72\n#### 24", 0.1)
    assert v.reason == "wrong"


def test_the_math_judge_penalizes_unfinished_completions():
    class Task:
        format_penalty = 0.3

    judge = build_judge(MathRewardConfig(), Task())
    assert judge.kind == "math"
    p = Problem("q", "#### 7")
    assert reward_reason(judge.judge(p, "7", finished=False)) == (-0.3, "unfinished")
    assert reward_reason(judge.judge(p, "3+4=7", finished=True)) == (1.0, "correct")


def reward_reason(v):
    return v.reward, v.reason


def test_math_reward_refuses_tasks_with_text_answers():
    with pytest.raises(ConfigError) as exc:
        validate_config({"task": {"type": "reverse"}, "reward": {"type": "math"}})
    assert exc.value.errors[0][0] == "reward.type"
    assert 'use reward.type = "rule"' in exc.value.errors[0][1]
