"""A run checkpointed at step k and resumed continues exactly as if uninterrupted."""

import pytest

from engine.api import MetricsEvent, run_local
from engine.telemetry.sinks import MemorySink

from .conftest import small_run


def _losses(sink: MemorySink) -> dict[int, float]:
    return {e.step: e.values["learner/loss"] for e in sink.of_type(MetricsEvent)
            if "learner/loss" in e.values}


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
