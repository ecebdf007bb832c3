"""Rule verifiers, the code task, and the inline reward's metrics (no Ray here)."""

import pytest

from engine.config import (
    ArithmeticTaskConfig,
    CodeTaskConfig,
    ConfigError,
    RuleRewardConfig,
    SandboxRewardConfig,
    validate_config,
)
from engine.reward import build_reward, reward_metrics, service_metrics
from engine.reward.rules import RuleVerifier
from engine.tasks import ArithmeticTask, CodeTask, Problem
from engine.tasks.code import spec_value

ARITH = ArithmeticTask(ArithmeticTaskConfig(format_penalty=0.25))
P = Problem("12-34=", "-22")


def verdict(text, finished=True, **cfg):
    v = RuleVerifier(RuleRewardConfig(**cfg), ARITH).judge(P, text, finished)
    return v.reward, v.reason


def test_the_task_rule_gives_a_reward_and_a_reason():
    assert verdict("-22") == (1.0, "correct")
    assert verdict("22") == (0.0, "wrong")
    assert verdict("-2a") == (-0.25, "format")
    assert verdict("-22", finished=False) == (-0.25, "unfinished")


def test_exact_match_compares_strings():
    assert verdict("-22", match="exact") == (1.0, "correct")
    assert verdict("-022", match="exact") == (0.0, "wrong")


def test_numeric_match_accepts_answers_within_the_tolerance():
    assert verdict("-21.6", match="numeric", tolerance=0.5) == (1.0, "correct")
    assert verdict("-21", match="numeric", tolerance=0.5) == (0.0, "wrong")
    assert verdict("minus", match="numeric") == (-0.25, "format")


def test_a_format_regex_is_checked_before_the_answer():
    assert verdict("-22", format_regex=r"-?\d+") == (1.0, "correct")
    assert verdict("-22", format_regex=r"\d+") == (-0.25, "format")


def test_rule_verdicts_are_deterministic():
    texts = ["-22", "22", "", "x", "-22.0"]
    first = [verdict(t, match="numeric") for t in texts]
    assert all(first == [verdict(t, match="numeric") for t in texts] for _ in range(3))


def test_a_bad_regex_and_a_sandbox_without_programs_are_config_errors_naming_the_field():
    with pytest.raises(ConfigError) as bad_regex:
        validate_config({"reward": {"format_regex": "("}})
    assert bad_regex.value.errors[0][0] == "reward.format_regex"
    with pytest.raises(ConfigError) as no_programs:
        validate_config({"reward": {"type": "sandbox"}})
    path, message = no_programs.value.errors[0]
    assert path == "reward.type" and 'task.type = "code"' in message


def test_code_specs_follow_python_precedence():
    assert spec_value("mul2add3", 5) == 13
    assert spec_value("add3mul2", 5) == 11
    assert spec_value("sub4mul3sub1", 2) == -11


def test_the_code_task_runs_programs_so_equivalent_ones_pass():
    task = CodeTask(CodeTaskConfig())
    for p in task.train_problems(0, 8):
        assert task.score(p, p.answer, finished=True) == 1.0
    p = Problem("add3mul2=", "f=lambda x:x+3*2")
    assert task.score(p, "f=lambda x:6+x", finished=True) == 1.0      # not the same text
    assert task.score(p, "f=lambda x:(x+3)*2", finished=True) == 0.0
    assert task.score(p, "f=lambda x:x+", finished=True) == -task.format_penalty


def test_code_answers_fit_the_budget_the_config_demands():
    cfg = validate_config({"task": {"type": "code", "max_terms": 3, "max_const": 99},
                           "rollout": {"max_new_tokens": 24}})
    task = CodeTask(cfg.task)
    longest = max(len(p.answer) for p in task.train_problems(0, 500))
    assert longest + 1 <= 24
    with pytest.raises(ConfigError):
        validate_config({"task": {"type": "code", "max_terms": 3, "max_const": 99},
                         "rollout": {"max_new_tokens": longest}})


def test_inline_sandbox_reward_reports_latency_queue_and_outcomes():
    task = CodeTask(CodeTaskConfig())
    reward = build_reward(SandboxRewardConfig(timeout_s=1.0), task)
    p = Problem("add3=", "f=lambda x:x+3")
    texts = ["f=lambda x:x+3", "f=lambda x:x", "f=lambda x:1/0", "while True: pass",
             "f=lambda x:len(bytearray(2**34))", "f=lambda x:x+3"]
    rewards = reward.score([p] * len(texts), texts, [True] * 5 + [False])
    pen = -task.format_penalty
    assert rewards == [1.0, 0.0, pen, pen, pen, pen]
    m = reward_metrics([service_metrics(reward)], {"time/reward_s": 1.0, "time/step_s": 4.0})
    assert m["reward/share"] == 0.25
    assert {k: m[f"reward/sandbox/{k}"] for k in
            ("pass", "wrong_answer", "crash", "timeout", "limit", "unfinished")} == {
        "pass": 1, "wrong_answer": 1, "crash": 1, "timeout": 1, "limit": 1, "unfinished": 1}
    assert 0 < m["reward/latency_s_p50"] <= m["reward/latency_s_p99"]
    assert m["reward/queue_depth_max"] == len(texts)
    assert reward.metrics() == {}, "metrics are per step: a second call starts afresh"
