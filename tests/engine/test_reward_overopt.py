"""The code reward-model preset is over-optimization on purpose: GRPO climbs a tiny learned
reward model while the sandbox, scoring the same samples alongside, shows the programs
failing more and more. RewardOverOptimization, the control plane's rule, evaluated on the
real run's events as ingest does, names it within the first steps of the split.

Measured (2026-11-30, 2 cores shared): agreement 0.86 at step 0, under 0.6 from step 9;
the verifier falls 0.63 -> 0.06 by step 10 while the RM score holds near 0.5; the alert
fires at step 9, the first full 10-step window. At 4 prompts a step (the run below, 24
steps: it is also the preset's no-false-alarm run, tests/engine/test_no_false_alarms.py,
where this alert is the only one allowed) it fired at step 6, three runs of three
(2026-12-02), where the earlier 12 steps at 8 prompts raised none (agreement still 0.83
at step 11): how soon the split shows depends on what the machine samples, so the run
is long enough to see it."""

import pytest

from engine.config import load_config

from .alert_watch import assert_quiet
from .preset_runs import CONFIGS_DIR, PresetRun, preset_run

PRESET = "code_reward_model.toml"
STEPS = 24          # StuckReward's 20-step window, for the no-false-alarm test
PROMPTS = 4


def overopt_run(tmp_path) -> PresetRun:
    """The preset at 4 prompts a step for STEPS steps, evaluation on its held-out split
    once (the run is judged by its alerts, not its evaluation); once for this module."""
    cfg = load_config(CONFIGS_DIR / PRESET)
    return preset_run(
        PRESET, STEPS, tmp_path,
        rollout=cfg.rollout.model_dump(mode="json") | {"prompts_per_step": PROMPTS},
        telemetry=cfg.telemetry.model_dump(mode="json") | {"eval_every_steps": 0,
                                                          "eval_samples": 1})


@pytest.mark.slow
def test_the_code_reward_model_preset_raises_reward_over_optimization(tmp_path, capsys):
    run = overopt_run(tmp_path)
    watch = run.watch
    assert run.summary.status == "succeeded"
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


@pytest.mark.slow
def test_the_code_reward_model_preset_raises_no_other_alert(tmp_path, capsys):
    """The run above (the same one, run once): over-optimization is what it is built to
    show; every other alert is still forbidden but one, a true one: BubbleHigh naming the
    reward stage. The preset scores every program twice by design (the reward model, and
    the sandbox alongside to show the split), so on 2 shared cores that stage is most of
    each step of a tiny model's: one CI run (2026-12-05) met 91 % twice in a row at step
    15, over reward_share_max 0.9. Any other bubble (idle devices, generation) still
    fails."""
    watch = overopt_run(tmp_path).watch
    bubbles = [f.cause for _, f in watch.fired if f.kind == "BubbleHigh"]
    assert all("the reward stage takes" in cause for cause in bubbles), bubbles
    assert_quiet(watch, PRESET, STEPS, capsys,
                 expected=frozenset({"RewardOverOptimization", "BubbleHigh"}))
