"""EnvErrors and EnvHang on hand-made histories: a multi-turn task's environment that
raises, or that holds the step (calls past their timeout, most of the step's time), is
named with the field to fix; a healthy environment's run and a run without one are quiet."""

from jobs.alerts.history import Thresholds
from jobs.alerts.rules import evaluate

from .test_alerts_outputs import facts_of, found, lengths
from .test_alerts_rules import FACTS, healthy


def findings(h, kind, t=None):
    return [f for f in evaluate(h, FACTS, t or Thresholds(), h.last_ts) if f.kind == kind]


def with_env(steps, errors=0.0, timeouts=0.0, env_s=0.1, from_step=0):
    h = healthy(steps)
    bad = range(from_step, steps)
    h.metrics["env/errors"] = {s: errors if s in bad else 0.0 for s in range(steps)}
    h.metrics["env/timeouts"] = {s: timeouts if s in bad else 0.0 for s in range(steps)}
    h.metrics["time/env_s"] = {s: env_s if s in bad else 0.1 for s in range(steps)}
    return h


def test_env_errors_fire_on_a_step_whose_environment_raised_and_resolve_when_fixed():
    h = with_env(6, errors=3.0, from_step=4)
    [f] = findings(h, "EnvErrors")
    assert f.step == 5 and "raised in 3 of step 5's calls" in f.cause
    assert "task.env.class" in f.runbook and "run's log" in f.runbook
    assert f.evidence["values"] == {"env/errors": 3.0, "threshold": 0}
    h.metrics["env/errors"][5] = 0.0
    assert findings(h, "EnvErrors") == []
    assert findings(with_env(6, errors=3.0), "EnvErrors", Thresholds(env_errors=3)) == []


def test_env_hang_names_timeouts_and_an_environment_that_takes_the_step():
    timed_out = with_env(6, timeouts=2.0, from_step=5)
    [f] = findings(timed_out, "EnvHang")
    assert "2 calls ran past task.env.step_timeout_s" in f.cause
    assert "step_timeout_s" in f.runbook and "async" in f.runbook
    slow = with_env(6, env_s=0.8, from_step=5)                # of a 1.0 s step
    [f] = findings(slow, "EnvHang")
    assert "80% of its wall time" in f.cause
    assert f.evidence["values"]["usual_env_s"] == 0.1
    assert findings(slow, "EnvHang", Thresholds(env_share=0.9)) == []
    assert findings(slow, "EnvHang", Thresholds(env_rise=9.0)) == []


def test_an_environment_slow_by_nature_is_not_a_hang():
    """A code sandbox holds most of every step from the first: its share alone is not a
    hang (the code-repair preset's 60-67 % raised EnvHang at every step)."""
    steady = with_env(8, env_s=0.8)                           # from step 0, every step
    assert findings(steady, "EnvHang") == []
    steady.metrics["time/env_s"][7] = 0.95                    # its own noise
    assert findings(steady, "EnvHang") == []


def test_a_healthy_environment_and_a_run_without_one_raise_neither():
    for h in (with_env(30), healthy(30)):
        assert findings(h, "EnvErrors") == findings(h, "EnvHang") == []


def test_a_trajectory_growing_into_its_token_budget_is_a_length_blowup_of_that_budget():
    """A trajectory's response is its turns and observations: its cap is task.env.max_tokens
    (96 here), not rollout.max_new_tokens (the cap of one turn, 16)."""
    env = facts_of(task={"type": "env", "env": {"max_tokens": 96}},
                   rollout={"max_new_tokens": 16})

    def rising(step):
        return 0.05 if step < 4 else 0.5

    at_turn_cap = lengths(rising, p99=lambda s: 16.0)
    assert found(at_turn_cap, "LengthBlowup", facts=env) == []
    [f] = found(lengths(rising, p99=lambda s: 90.0), "LengthBlowup", facts=env)
    assert "p99 length is 90 of task.env.max_tokens 96" in f.cause
    assert "task.env.max_tokens 96 -> 192" in f.runbook and "max_new_tokens" not in f.runbook
