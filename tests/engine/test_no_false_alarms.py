"""No false alarms: every preset in configs/, run healthy, raises no alert at all.

Each preset runs its own loop (model, task, algorithm, rollout backend, batch sizes) for
its test length with the default thresholds; only the warm start is the shared short one,
to keep the suite's time modest on 2 cores. The rules are evaluated as ingest does (at
every step) and as the periodic task would at its worst moment (just before each event).
"""

from pathlib import Path

import pytest

from engine.api import run_local
from engine.config import load_config, validate_config
from jobs.alerts.history import RunFacts

from .alert_watch import AlertWatch

CONFIGS = sorted((Path(__file__).parents[2] / "configs").glob("*.toml"))
TEST_STEPS = 4


def healthy_run(path: Path, tmp_path, steps: int = TEST_STEPS, **rollout) -> AlertWatch:
    """``rollout``: sampling settings that replace the preset's."""
    data = load_config(path).model_dump(mode="json", exclude_none=True)
    data.update(steps=steps, max_seconds=None,
                warm_start={"steps": 60, "batch_size": 32})
    data["task"]["eval_size"] = 16
    data["telemetry"].update(eval_every_steps=0, eval_samples=1)
    data["rollout"].update(rollout)
    cfg = validate_config(data)
    watch = AlertWatch(RunFacts.from_config(cfg, "running"))
    run_local(cfg, tmp_path, sink=watch)
    return watch


@pytest.mark.slow
@pytest.mark.parametrize("path", [
    pytest.param(p, marks=[pytest.mark.vllm] if "vllm" in p.name else [], id=p.name)
    for p in CONFIGS])
def test_a_healthy_preset_raises_no_alert(path, tmp_path, capsys):
    watch = healthy_run(path, tmp_path)
    assert watch.steps_checked == TEST_STEPS
    assert watch.fired == [], [f"step {s}: {f.kind}: {f.cause}" for s, f in watch.fired]
    with capsys.disabled():
        print(f"\n{path.name}: {watch.steps_checked} healthy steps checked, no alert")


@pytest.mark.slow
@pytest.mark.timeout(2400)      # 40 steps: 5-15 min on 2 cores shared five ways
@pytest.mark.parametrize("preset", [
    "demo_arithmetic.toml",
    pytest.param("demo_arithmetic_vllm.toml", marks=pytest.mark.vllm)])
def test_a_healthy_top_p_run_keeps_the_gap_at_rounding_and_raises_no_alert(
        preset, tmp_path, capsys):
    # top_p = 0.9 at T = 0.8: the learner recomputes the nucleus the engine sampled from.
    # Had it recomputed the full tempered distribution, each token's gap would be -log of
    # the nucleus' mass (5e-2 nats/token on this warm start, measured; top_p = 1: 1e-7).
    watch = healthy_run(CONFIGS[0].parent / preset, tmp_path, steps=40,
                        temperature=0.8, top_p=0.9)
    assert watch.steps_checked == 40
    # The gap rules must stay quiet. On this test's short warm start at T = 0.8 the policy
    # answers almost nothing right (reward ~0.01), so most groups have all-equal rewards
    # and StuckReward names the flat learning signal (samples/zero_std_group_frac): true
    # of this run, and the only alert allowed here.
    fired = [(s, f) for s, f in watch.fired if f.key != "StuckReward:signal"]
    assert fired == [], [f"step {s}: {f.kind}: {f.cause}" for s, f in fired]
    means = list(watch.history.metrics["logprob_gap/mean"].values())
    maxes = list(watch.history.metrics["logprob_gap/max"].values())
    assert len(means) == 40 and max(means) < 1e-5, max(means)
    with capsys.disabled():
        print(f"\n{preset} at top_p = 0.9, T = 0.8: 40 healthy steps, no gap alert; "
              f"logprob_gap/mean <= {max(means):.2e}, logprob_gap/max <= {max(maxes):.2e}")
