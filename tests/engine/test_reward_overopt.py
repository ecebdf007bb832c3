"""The code reward-model preset is over-optimization on purpose: GRPO climbs a tiny learned
reward model while the sandbox, scoring the same samples alongside, shows the programs
failing more and more. RewardOverOptimization, the control plane's rule, evaluated on the
real run's events as ingest does, names it within the first steps of the split.

Measured (2026-11-30, 2 cores shared): agreement 0.86 at step 0, under 0.6 from step 9;
the verifier falls 0.63 -> 0.06 by step 10 while the RM score holds near 0.5; the alert
fires at step 9, the first full 10-step window."""

from pathlib import Path

import pytest

from engine.api import run_local
from engine.config import load_config
from jobs.alerts.history import RunFacts

from .alert_watch import AlertWatch

PRESET = Path(__file__).parents[2] / "configs" / "code_reward_model.toml"
STEPS = 12


@pytest.mark.slow
def test_the_code_reward_model_preset_raises_reward_over_optimization(tmp_path, capsys):
    cfg = load_config(PRESET).model_copy(update={"steps": STEPS, "max_seconds": None})
    watch = AlertWatch(RunFacts.from_config(cfg, "running"))
    assert run_local(cfg, tmp_path, sink=watch).status == "succeeded"
    first = watch.first("RewardOverOptimization")
    agreement = watch.history.series("reward/rm_vs_verifier_agreement")
    verifier = watch.history.series("reward/verifier_mean")
    assert first is not None, f"no alert; agreement {agreement}, verifier {verifier}"
    step, finding = first
    assert 3 <= step < STEPS, "fires once the split shows, not on the first steps"
    assert agreement[0][1] > 0.6                # it starts agreeing: the split is learned
    assert "verifier" in finding.cause
    assert finding.evidence["compare"]["name"] in ("reward/verifier_mean",
                                                   "reward/rm_vs_verifier_agreement")
    with capsys.disabled():
        print(f"\nRewardOverOptimization at step {step}: {finding.cause}")
