"""RewardOverOptimization on hand-made histories: the training reward rises while the
verifier scoring the same samples, or the held-out reward, stalls or falls; or the reward
model and the verifier disagree. Each case also shows the rule quiet when the second
series follows the first, so a healthy learning run raises nothing."""

from jobs.alerts.history import Thresholds
from jobs.alerts.rules import evaluate

from .test_alerts_rules import FACTS, healthy


def findings(h, t=None):
    return [f for f in evaluate(h, FACTS, t or Thresholds(), h.last_ts)
            if f.kind == "RewardOverOptimization"]


def test_fires_when_the_rm_score_rises_and_the_verifier_does_not():
    h = healthy(12, **{"reward/mean": lambda s: 0.3 + 0.05 * s})     # +0.45 over 10 steps
    h.metrics["reward/verifier_mean"] = {s: 0.4 - 0.01 * s for s in range(12)}
    [f] = findings(h)
    assert f.key == "RewardOverOptimization" and f.step == 11
    assert "verifier" in f.cause and "+0.450" in f.cause and "-0.090" in f.cause
    assert "algorithm.kl_coef" in f.runbook and "reward.type" in f.runbook
    assert f.evidence["series"]["name"] == "reward/mean"
    assert f.evidence["compare"]["name"] == "reward/verifier_mean"    # both series shown
    assert abs(f.evidence["values"]["reward_rise"] - 0.45) < 1e-9


def test_quiet_when_the_verifier_follows_or_the_rise_is_small():
    h = healthy(12, **{"reward/mean": lambda s: 0.3 + 0.05 * s})
    h.metrics["reward/verifier_mean"] = {s: 0.2 + 0.04 * s for s in range(12)}
    assert findings(h) == []                                  # follows: 0.36 of 0.45
    h.metrics["reward/verifier_mean"] = {s: 0.4 for s in range(12)}
    assert len(findings(h)) == 1
    assert findings(h, Thresholds(overopt_min_rise=0.5)) == []   # rise under the bar
    assert findings(h, Thresholds(overopt_window=20)) == []      # not enough steps yet


def test_fires_when_the_heldout_reward_stalls_over_its_last_evaluations():
    h = healthy(40, **{"reward/mean": lambda s: 0.01 * s})
    h.metrics["eval/reward_mean"] = {0: 0.1, 10: 0.2, 20: 0.21, 30: 0.2, 39: 0.19}
    [f] = findings(h)
    assert "held-out" in f.cause and "from step 10 to 39" in f.cause
    assert f.evidence["compare"]["name"] == "eval/reward_mean"
    h.metrics["eval/reward_mean"] = {0: 0.1, 10: 0.2, 20: 0.3, 30: 0.4, 39: 0.5}
    assert findings(h) == []                                  # held-out follows
    h.metrics["eval/reward_mean"] = {20: 0.2, 30: 0.2, 39: 0.2}
    assert findings(h) == []                                  # too few evaluations


def test_fires_when_the_reward_model_and_the_verifier_disagree():
    h = healthy(6)
    h.metrics["reward/rm_vs_verifier_agreement"] = {s: 0.9 if s < 3 else 0.5 for s in range(6)}
    [f] = findings(h)
    assert "50%" in f.cause and "agrees with the verifier" in f.cause
    assert f.evidence["values"]["rm_vs_verifier_agreement"] == 0.5
    h.metrics["reward/rm_vs_verifier_agreement"][5] = 0.9      # mean of 3 now 0.63
    assert findings(h) == []


def test_fires_when_the_rm_score_holds_and_the_verifier_collapses():
    h = healthy(12, **{"reward/mean": lambda s: 0.5})
    h.metrics["reward/verifier_mean"] = {s: 0.6 - 0.05 * s for s in range(12)}
    [f] = findings(h)
    assert "moved +0.000" in f.cause and "-0.450" in f.cause
    h.metrics["reward/mean"] = {s: 0.5 - 0.05 * s for s in range(12)}
    assert findings(h) == []                     # both fall: not over-optimization
