"""RewardErrors on hand-made histories: it fires when more than the threshold share of a
step's samples failed in the user's reward function, names the cause, points at
reward.function, and stays quiet at or under the threshold."""

from jobs.alerts.history import Thresholds
from jobs.alerts.rules import evaluate

from .test_alerts_rules import FACTS, healthy


def findings(h, t=None):
    return [f for f in evaluate(h, FACTS, t or Thresholds(), h.last_ts)
            if f.kind == "RewardErrors"]


def test_reward_errors_fire_when_a_steps_failures_pass_the_threshold():
    h = healthy(8)
    h.metrics["reward/error_frac"] = {s: 0.5 if s >= 6 else 0.0 for s in range(8)}
    [f] = findings(h)
    assert f.step == 7
    assert "50%" in f.cause and "step 7" in f.cause and "reward_error" in f.cause
    assert "reward.function" in f.runbook and "traceback" in f.runbook
    assert f.evidence["values"] == {"reward/error_frac": 0.5, "threshold": 0.1}
    assert f.evidence["series"]["values"][-2:] == [0.5, 0.5]


def test_reward_errors_stay_quiet_at_the_threshold_and_resolve_when_fixed():
    h = healthy(4)
    h.metrics["reward/error_frac"] = {0: 0.1, 1: 0.1, 2: 0.1, 3: 0.1}
    assert findings(h) == []                          # "more than" the threshold
    assert len(findings(h, Thresholds(reward_error_frac=0.05))) == 1
    h.metrics["reward/error_frac"][3] = 0.0          # the last step is clean again
    assert findings(h, Thresholds(reward_error_frac=0.05)) == []


def test_runs_without_the_metric_raise_no_reward_errors():
    assert findings(healthy(10)) == []
