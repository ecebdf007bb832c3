"""The user's own reward function: loaded from a file or a module, called per sample with
the dataset row; a function that raises or returns a non-number scores 0 (reason
reward_error), is counted in reward/error_frac, logged once per distinct error, alerted
(RewardErrors) and the run finishes."""

import json
import sys
import textwrap

import pytest

from engine.api import LogEvent, MetricsEvent, event_from_dict, run_local
from engine.config import ConfigError, PythonRewardConfig, validate_config
from engine.reward import build_reward
from engine.reward.user_function import load_function
from engine.tasks.base import Problem
from jobs.alerts.history import RunFacts

from .alert_watch import AlertWatch

REWARD = textwrap.dedent('''
    def score(prompt, completion, answer, **row):
        """Half for a completion that names the solution's first number, + its row's hint."""
        first = row["solution"].split("+")[0].split("-")[0].split("*")[0]
        return (0.5 if first in completion else 0.0) + row.get("hint", 0.0)

    def flaky(prompt, completion, answer, **row):
        if "pens" in prompt:
            raise KeyError("no pens allowed")
        if "cards" in prompt:
            return "n/a"
        return float(len(completion) % 2)

    not_a_function = 3
''')


@pytest.fixture
def reward_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(REWARD)
    return str(path)


def collect(lines):
    return lambda message, level="info": lines.append((level, message))


def test_a_file_function_gets_the_prompt_the_completion_the_answer_and_the_row(reward_file):
    reward = build_reward(PythonRewardConfig(function=f"{reward_file}:score"), task=None)
    row = {"question": "q", "answer": "#### 7", "solution": "3+4=7", "hint": 0.25}
    p = Problem("tom has 3", "#### 7", row=row)
    assert reward.score([p, p], ["3+4=7", "9"], [True, False]) == [0.75, 0.25]
    assert reward.metrics()["reward/python/scored"] == 2.0


def test_a_module_function_is_imported_by_name(tmp_path, monkeypatch):
    (tmp_path / "team_rewards").mkdir()
    (tmp_path / "team_rewards" / "__init__.py").write_text(REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = load_function("team_rewards:score")
    assert fn("p", "3", "a", solution="3+4=7") == 0.5
    sys.modules.pop("team_rewards", None)


def test_errors_score_zero_are_counted_and_each_distinct_one_is_logged_once(reward_file):
    lines = []
    reward = build_reward(PythonRewardConfig(function=f"{reward_file}:flaky"), task=None,
                          log=collect(lines))
    pens, cards, ok = Problem("3 pens", "1"), Problem("2 cards", "1"), Problem("2 cups", "1")
    problems = [pens, cards, ok, pens, cards, ok, pens, ok]
    rewards = reward.score(problems, ["ab"] * 7 + ["abc"], [True] * 8)
    assert rewards == [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    m = reward.metrics()
    assert m["reward/error_frac"] == 5 / 8
    assert m["reward/python/reward_error"] == 5.0 and m["reward/python/scored"] == 3.0
    assert [level for level, _ in lines] == ["error", "error"]
    assert "KeyError: 'no pens allowed'" in lines[0][1]
    assert 'in flaky\n    raise KeyError("no pens allowed")' in lines[0][1]   # user frames
    assert "returned a str, not a finite number" in lines[1][1]
    reward.score([pens, cards], ["x", "y"], [True, True])          # seen before: not again
    assert len(lines) == 2
    assert reward.metrics()["reward/error_frac"] == 1.0


def test_a_nan_is_an_error_too(tmp_path):
    (tmp_path / "r.py").write_text("def f(prompt, completion, answer, **row):\n"
                                   "    return float('nan')\n")
    lines = []
    reward = build_reward(PythonRewardConfig(function=f"{tmp_path / 'r.py'}:f"), None,
                          log=collect(lines))
    assert reward.score([Problem("p", "a")], ["c"], [True]) == [0.0]
    assert "returned nan, not a finite number" in lines[0][1]


def test_bad_function_names_are_refused_at_config_time(tmp_path):
    def error(function):
        with pytest.raises(ConfigError) as exc:
            validate_config({"reward": {"type": "python", "function": function}})
        return exc.value.errors[0]

    assert error("score") == ("reward.function", "reward.function='score' must be \"package."
                              "module:callable\" or \"path/to/file.py:callable\"")
    field, msg = error(f"{tmp_path}/missing.py:score")
    assert field == "reward.function" and "no such file" in msg
    field, msg = error("os:system")
    assert "the standard library" in msg and "your own module or file" in msg
    import os

    field, msg = error(f"{os.__file__}:system")   # the same module, named by its path
    assert "names a file of the standard library" in msg
    field, msg = error("my-rewards:score")
    assert "is not a module name" in msg


def test_a_function_that_cannot_be_loaded_is_a_config_error_at_start(reward_file, tmp_path):
    def error(function):
        with pytest.raises(ConfigError) as exc:
            load_function(function)
        assert exc.value.errors[0][0] == "reward.function"
        return exc.value.errors[0][1]

    assert "defines no 'scor'" in error(f"{reward_file}:scor")
    assert "it has score, flaky" in error(f"{reward_file}:scor")
    assert "is a int, not a function" in error(f"{reward_file}:not_a_function")
    assert "No module named 'no_such_rewards_pkg'" in error("no_such_rewards_pkg:f")
    (tmp_path / "broken.py").write_text("import no_such_dependency\n")
    assert "raised ModuleNotFoundError" in error(f"{tmp_path / 'broken.py'}:f")


def sample_run(function: str, steps: int = 3):
    return validate_config({
        "name": "user-reward", "steps": steps,
        "task": {"type": "dataset", "path": "data/gsm8k_sample/train.jsonl",
                 "eval_path": "data/gsm8k_sample/test.jsonl", "prompt_key": "question",
                 "sft_key": "solution", "eval_size": 8},
        "reward": {"type": "python", "function": function},
        "warm_start": {"steps": 0},
        "algorithm": {"group_size": 4, "minibatches": 1},
        "rollout": {"prompts_per_step": 8, "max_new_tokens": 6},
        "telemetry": {"eval_samples": 1},
    })


def events_of(out):
    return [event_from_dict(json.loads(li)) for li in (out / "events.jsonl").open()]


@pytest.mark.slow
def test_a_run_trains_on_a_user_reward_file(tmp_path, reward_file):
    summary = run_local(sample_run(f"{reward_file}:score"), tmp_path / "run")
    assert summary.status == "succeeded" and summary.steps_done == 3
    steps = [e.values for e in events_of(tmp_path / "run")
             if isinstance(e, MetricsEvent) and "reward/mean" in e.values]
    assert len(steps) == 3
    for m in steps:
        assert m["reward/python/scored"] == 32.0 and m["reward/error_frac"] == 0.0
        assert 0.0 <= m["reward/mean"] <= 0.5


@pytest.mark.slow
def test_a_raising_reward_is_counted_logged_once_alerted_and_the_run_finishes(tmp_path,
                                                                              reward_file):
    cfg = sample_run(f"{reward_file}:flaky", steps=4)
    watch = AlertWatch(RunFacts.from_config(cfg, "running"))
    summary = run_local(cfg, tmp_path / "run", sink=watch)
    assert summary.status == "succeeded" and summary.steps_done == 4

    events = events_of(tmp_path / "run")
    steps = [e.values for e in events if isinstance(e, MetricsEvent) and "reward/mean" in e.values]
    fracs = [m["reward/error_frac"] for m in steps]
    assert max(fracs) > 0.1 and all(f < 1.0 for f in fracs), fracs
    for m in steps:
        assert m["reward/python/reward_error"] == m["reward/error_frac"] * 32

    errors = [e.message for e in events if isinstance(e, LogEvent) and e.level == "error"]
    assert sum("KeyError: 'no pens allowed'" in m for m in errors) == 1
    assert sum("returned a str, not a finite number" in m for m in errors) == 1

    step, finding = watch.first("RewardErrors")
    assert fracs[step] > 0.1
    assert f"{fracs[step]:.0%} of step {step}'s samples" in finding.cause
    assert "reward.function" in finding.runbook
