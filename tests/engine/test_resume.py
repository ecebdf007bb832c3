"""A run checkpointed at step k and resumed continues exactly as if uninterrupted."""

import json

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
def test_a_resumed_ppo_run_continues_actor_and_critic_as_if_uninterrupted(tmp_path,
                                                                          model_cache):
    """The critic with the learner; on a Ray bundle of its own, its state saved by its
    actor: tests/engine/test_learning.py resumes that learning run's last step."""
    cfg = small_run(steps=2, algorithm={"type": "ppo"},
                    checkpoint={"every_steps": 1, "keep_last": 5})

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


PAIRS = ((1, 2), (3, 4), (5, 1), (2, 2), (6, 3), (4, 1))
ROWS = [f"{a}+{b}=" for a, b in PAIRS]


def test_resumed_twice_a_run_trains_each_dataset_prompt_once_an_epoch_and_a_skip_is_a_gap(
        tmp_path, model_cache):
    """one_step_off draws a step ahead, so each stop leaves prompts in flight: the resumed
    run serves them first. 6 rows, 4 prompts a step: epochs straddle steps and resumes."""
    from engine.api import SamplesEvent
    from engine.config import validate_config
    from engine.orchestration.ledger import DataLedger
    from jobs.alerts.history import RunFacts

    from .alert_watch import AlertWatch

    for name, pairs in (("train", PAIRS), ("test", ((7, 1), (8, 1)))):
        (tmp_path / f"{name}.jsonl").write_text("".join(
            json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n"
            for a, b in pairs))
    data = {"name": "t", "steps": 4,
            "task": {"type": "dataset", "path": str(tmp_path / "train.jsonl"),
                     "eval_path": str(tmp_path / "test.jsonl"), "eval_size": 2},
            "warm_start": {"steps": 0}, "async_policy": {"type": "one_step_off"},
            "algorithm": {"group_size": 2, "minibatches": 1},
            "rollout": {"prompts_per_step": 4, "max_new_tokens": 2},
            "telemetry": {"eval_samples": 1, "sample_groups": 4}}
    cfg = validate_config(data)
    out, trained = tmp_path / "run", {}
    for stop_at in (1, 2, 3):                   # started, then resumed twice
        sink = MemorySink()
        run_local(cfg, out, steps=stop_at, sink=sink, resume=stop_at > 1)
        for e in sink.of_type(SamplesEvent):   # every group, in the order trained
            trained[e.step] = [s.prompt for s in e.samples][::2]      # a group's first
    prompts = [p for step in sorted(trained) for p in trained[step]]
    assert sorted(trained) == [0, 1, 2] and len(prompts) == 12
    assert sorted(prompts[:6]) == sorted(prompts[6:]) == sorted(ROWS)   # each once an epoch
    ledger = DataLedger.from_state(json.loads(
        (out / "checkpoints" / "step_000003" / "data.json").read_text()))
    assert (ledger.trained, ledger.skipped, ledger.repeated, ledger.epoch) == (12, 0, 0, 2)
    assert ledger.served == 16 and len(ledger.resumed) == 4     # the next step's, in flight

    skipping = validate_config({**data, "faults": {"skip_on_resume": {"prompts": 3}}})
    watch = AlertWatch(RunFacts.from_config(skipping, "running"))
    run_local(skipping, out, steps=4, sink=watch, resume=True)
    skipped = {e.step: e.values["data/skipped"] for e in watch.events
               if isinstance(e, MetricsEvent) and "data/skipped" in e.values}
    assert skipped == {3: 3.0}
    hit = watch.first("DataIntegrity")
    assert hit is not None and hit[1].key == "DataIntegrity:gap" and hit[0] == 3
    assert "3 training prompt(s) were passed over" in hit[1].cause
