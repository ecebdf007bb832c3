"""GRPO and PPO learn: a shortened demo run, fixed seed, held-out reward before vs after.

The demo (configs/demo_arithmetic.toml) is the same recipe for 5 minutes; here 40 steps,
with the torch sampler and with vLLM as the rollout engine (same seed, same warm start).
Measured on this machine type (runs are deterministic for a given environment), held-out
mean reward at step 0 -> step 40: 0.669 -> 0.807 (torch) and 0.643 -> 0.812 (vLLM) on
2026-11-30; the same vLLM run disaggregated on Ray with vLLM's own weight-transfer API
lands on the same numbers. Earlier environments measured 0.580 -> 0.684 and 0.582 -> 0.650
(and, before that, a warm start at 0.53 that gained +0.18 at lr 2e-4; with later ones lr
2e-4 oscillates, so the recipe uses 1e-4). The margin below is under the smallest gain.
"""

import statistics

import pytest

from engine.api import MetricsEvent, SpanEvent, run_local
from engine.config import load_config, validate_config
from engine.telemetry.sinks import MemorySink

from .test_config import CONFIGS


def trained_from_the_warm_start(preset: str, steps: int, out, sink: MemorySink | None = None,
                                **sections) -> list[dict[str, float]]:
    """Run configs/<preset> for ``steps`` steps (``sections`` replace the preset's);
    assert held-out reward gained at least 0.05 over a warm start that left room to learn;
    return each step's metrics."""
    [path] = [p for p in CONFIGS if p.name == preset]
    data = load_config(path).model_dump(mode="json", exclude_none=True)
    cfg = validate_config(data | sections | {"steps": steps, "max_seconds": None})
    sink = sink or MemorySink()
    summary = run_local(cfg, out, sink=sink)

    before = summary.eval_before["eval/reward_mean"]
    after = summary.eval_after["eval/reward_mean"]
    print(f"\n{preset}, {steps} steps: held-out reward {before:.3f} -> {after:.3f}")
    assert 0.05 < before < 0.95, "the warm start should leave room to learn"
    assert after - before >= 0.05, (before, after)
    return [e.values for e in sink.of_type(MetricsEvent) if "reward/mean" in e.values]


@pytest.mark.slow
@pytest.mark.parametrize("demo_name", [
    "demo_arithmetic.toml",
    pytest.param("demo_arithmetic_vllm.toml", marks=pytest.mark.vllm),
])
def test_grpo_raises_held_out_reward_from_the_warm_start(tmp_path, model_cache, demo_name):
    rewards = [m["reward/mean"] for m in trained_from_the_warm_start(demo_name, 40, tmp_path)]
    assert len(rewards) == 40
    assert statistics.fmean(rewards[-10:]) > statistics.fmean(rewards[:10])


@pytest.mark.slow
def test_ppo_raises_held_out_reward_from_the_warm_start(tmp_path, model_cache):
    """configs/ppo_arithmetic.toml for 30 steps: the demo's task and warm start, PPO with a
    critic colocated with the learner. Measured held-out mean reward 0.567 -> 0.682 (30
    steps) and -> 0.672 (40) with the learner on a 16-core CPU (2026-11-30); its critic's
    explained variance stays near 0 this early (whether a tiny model answers right is
    hard to tell from the prompt), so the gain is mostly the whitened returns'."""
    steps = trained_from_the_warm_start("ppo_arithmetic.toml", 30, tmp_path)
    assert len(steps) == 30
    assert all("critic/value_loss" in m and m["time/critic_s"] > 0 for m in steps)


@pytest.mark.slow
def test_ppo_learns_with_its_critic_on_a_ray_bundle_of_its_own(tmp_path, model_cache,
                                                               ray_gpus):
    """The same recipe with the critic as its own actor (placement.critic_devices = 1)
    beside a colocated rollout worker + learner on Ray: the critic's values give the
    advantages, then its value update runs while the learner trains the policy."""
    sink = MemorySink()
    steps = trained_from_the_warm_start(
        "ppo_arithmetic.toml", 30, tmp_path, sink,
        placement={"type": "colocated", "ray": True, "critic_devices": 1},
        weight_sync={"type": "shm"})
    assert all("critic/value_loss" in m and "device/utilization/gpu:1" in m for m in steps)
    spans = sink.of_type(SpanEvent)
    assert {s.phase for s in spans if s.device == "gpu:1"} == {"critic", "waiting"}
    assert "critic" not in {s.phase for s in spans if s.device == "gpu:0"}
