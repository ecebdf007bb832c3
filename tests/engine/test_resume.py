"""A run checkpointed at step k and resumed continues exactly as if uninterrupted."""

import pytest

from engine.api import MetricsEvent, run_local
from engine.telemetry.sinks import MemorySink

from .conftest import small_run


def _losses(sink: MemorySink, name: str = "learner/loss") -> dict[int, float]:
    return {e.step: e.values[name] for e in sink.of_type(MetricsEvent) if name in e.values}


@pytest.mark.slow
def test_resumed_step_matches_the_uninterrupted_run(tmp_path, model_cache):
    cfg = small_run(steps=3, checkpoint={"every_steps": 1, "keep_last": 5})

    straight = MemorySink()
    run_local(cfg, tmp_path / "straight", sink=straight)

    first = MemorySink()
    run_local(cfg, tmp_path / "split", steps=2, sink=first)
    resumed = MemorySink()
    summary = run_local(cfg, tmp_path / "split", sink=resumed, resume=True)

    assert summary.steps_done == 3
    assert _losses(first) == {0: _losses(straight)[0], 1: _losses(straight)[1]}
    assert list(_losses(resumed)) == [2]
    assert _losses(resumed)[2] == _losses(straight)[2]
    assert _losses(straight)[2] != _losses(straight)[1]      # the loss is not a constant
    # The resumed driver continues the run's event sequence: consumers dedup by seq.
    assert resumed.events[0].seq == first.events[-1].seq + 1


@pytest.mark.slow
@pytest.mark.parametrize("where", ["with_the_learner", "on_its_own_ray_bundle"])
def test_a_resumed_ppo_run_continues_actor_and_critic_as_if_uninterrupted(tmp_path,
                                                                          model_cache,
                                                                          request, where):
    placement = {}
    if where == "on_its_own_ray_bundle":        # its state saved by the critic's actor
        request.getfixturevalue("ray_gpus")
        placement = {"placement": {"type": "colocated", "ray": True, "critic_devices": 1},
                     "weight_sync": {"type": "shm"}}
    cfg = small_run(steps=2, algorithm={"type": "ppo"},
                    checkpoint={"every_steps": 1, "keep_last": 5}, **placement)

    straight = MemorySink()
    run_local(cfg, tmp_path / "straight", sink=straight)
    run_local(cfg, tmp_path / "split", steps=1, sink=MemorySink())
    assert (tmp_path / "split" / "checkpoints" / "step_000001" / "critic").is_dir()
    resumed = MemorySink()
    run_local(cfg, tmp_path / "split", sink=resumed, resume=True)

    for name in ("learner/loss", "critic/value_loss", "critic/value_mean"):
        assert list(_losses(resumed, name)) == [1]
        assert _losses(resumed, name)[1] == _losses(straight, name)[1], name
    # The critic trained at step 0: its values at step 1 are no longer the fresh head's 0.
    assert _losses(straight, "critic/value_mean")[1] != 0.0
