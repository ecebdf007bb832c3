"""A run checkpointed at step k and resumed continues exactly as if uninterrupted."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.api import MetricsEvent, run_local
from engine.config import dump_config
from engine.telemetry.sinks import MemorySink, read_jsonl

from .conftest import small_run
from .preset_runs import step_values


def _losses(sink: MemorySink, name: str = "learner/loss") -> dict[int, float]:
    return step_values(sink, name)


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
REPO = Path(__file__).resolve().parents[2]
KILL_DEADLINE_S = 600          # only a hung test ends on it; nothing is timed against it


def run_engine_until_checkpoint_then_sigkill(cfg, out: Path, steps: int, ckpt_step: int,
                                             log: Path) -> None:
    """``python -m engine run --resume`` on ``out``, SIGKILLed once its checkpoint of
    ``ckpt_step`` is there (renamed into place: complete, data.json in it)."""
    config = out.parent / "killed.toml"
    config.write_text(dump_config(cfg))
    ckpt = out / "checkpoints" / f"step_{ckpt_step:06d}"
    with log.open("w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "engine", "run", str(config),
                                 "--out", str(out), "--steps", str(steps), "--resume"],
                                cwd=REPO, stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + KILL_DEADLINE_S
        while not (ckpt / "data.json").exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the engine never wrote {ckpt.name} (exit {proc.returncode}):\n"
                            + log.read_text()[-4000:])
            time.sleep(0.05)
    finally:
        proc.kill()                                     # SIGKILL: no handler, no last word
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, log.read_text()[-4000:]


def test_stopped_thrice_once_by_sigkill_a_run_trains_each_prompt_once_an_epoch_and_a_skip_is_a_gap(
        tmp_path, model_cache, monkeypatch):
    """one_step_off draws a step ahead, so each stop leaves prompts in flight: the resumed
    run serves them first. 6 rows, 4 prompts a step: epochs straddle steps and resumes.
    The second leg is the engine's CLI in a process of its own, SIGKILLed as its weight
    sync of step 2 hangs (faults.sync_hang), its checkpoint of step 2 written: nothing of
    the run's own shutdown runs (no final checkpoint, no last status)."""
    from engine.api import RunStatusEvent, SamplesEvent
    from engine.config import validate_config
    from engine.learner import checkpoint as ck
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
    out, publish = tmp_path / "run", ck.publish

    def complete_when_published(staging, final):      # the in-process legs' saves
        assert (staging / "data.json").exists() and (staging / "state.json").exists()
        publish(staging, final)

    monkeypatch.setattr(ck, "publish", complete_when_published)
    run_local(cfg, out, steps=1, sink=MemorySink())                      # stopped at 1
    hang = validate_config({**data, "checkpoint": {"every_steps": 1},
                            "faults": {"sync_hang": {"at_step": 2, "seconds": 3600}}})
    run_engine_until_checkpoint_then_sigkill(hang, out, steps=3, ckpt_step=2,
                                             log=tmp_path / "killed.log")
    run_local(cfg, out, steps=3, sink=MemorySink(), resume=True)        # resumed, stopped

    events = read_jsonl(out / "events.jsonl")                           # all three legs'
    # Each process went on from the one before it: one event sequence, no seq twice.
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    started, ended = ["starting", "warm_start", "running"], ["succeeded"]
    assert [e.status for e in events if isinstance(e, RunStatusEvent)] == \
        started + ended + started + started + ended               # the killed leg: no end
    trained = {}
    for e in events:            # every group, in the order trained; a redone step's last
        if isinstance(e, SamplesEvent):
            trained[e.step] = [s.prompt for s in e.samples][::2]         # a group's first
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


class Killed(BaseException):
    """A SIGKILL landing at a chosen instant: nothing after it runs."""


def complete(d: Path, step: int, data: str = "{}") -> Path:
    """``d`` as a finished checkpoint of ``step`` (its state and data files; no weights)."""
    d.mkdir(parents=True)
    (d / "state.json").write_text(json.dumps({"step": step}))
    (d / "data.json").write_text(data)
    return d


def test_a_resume_takes_the_latest_complete_checkpoint_wherever_a_kill_landed(tmp_path,
                                                                           monkeypatch):
    from engine.learner import checkpoint as ck

    complete(tmp_path / "step_000001", 1)
    complete(tmp_path / ".step_000002.k3x9", 2)      # a save killed before its rename
    complete(tmp_path / "step_000002.partial", 2)    # a fork's copy cut off (engine.ray_job)
    (tmp_path / ".critic_step_000002").mkdir()       # a PPO critic's, its save then killed
    (tmp_path / "step_000003").mkdir()               # no state.json: never renamed in whole
    assert ck.latest_checkpoint(tmp_path) == tmp_path / "step_000001"

    # Step 1 saved again (a run's final checkpoint after its periodic one), killed between
    # moving the old save aside and renaming the new one in: the old one still counts.
    real_rename = os.rename

    def killed(src, dst):
        raise Killed

    def killed_after_the_first_rename(src, dst):
        real_rename(src, dst)
        monkeypatch.setattr(ck.os, "rename", killed)

    monkeypatch.setattr(ck.os, "rename", killed_after_the_first_rename)
    with pytest.raises(Killed):
        ck.publish(complete(tmp_path / ".step_000001.new", 1, '{"new": 1}'),
                   tmp_path / "step_000001")
    monkeypatch.setattr(ck.os, "rename", real_rename)
    assert ck.latest_checkpoint(tmp_path) == tmp_path / "step_000001.replaced"
    assert (tmp_path / "step_000001.replaced" / "data.json").read_text() == "{}"

    # The resumed run saves step 1 again and prunes: the new save is the one, and what the
    # kills left is gone (a fork's .partial is engine.ray_job's to redo).
    ck.publish(complete(tmp_path / ".step_000001.again", 1, '{"again": 1}'),
               tmp_path / "step_000001")
    ck.prune_checkpoints(tmp_path, keep_last=2)
    assert ck.latest_checkpoint(tmp_path) == tmp_path / "step_000001"
    assert (tmp_path / "step_000001" / "data.json").read_text() == '{"again": 1}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000001", "step_000002.partial"]


def test_a_line_a_killed_driver_tore_is_skipped_and_the_resumed_driver_goes_on_after_it(
        tmp_path):
    from engine.events import LogEvent
    from engine.telemetry.sinks import JsonlSink, last_seq

    path = tmp_path / "events.jsonl"
    killed = JsonlSink(path)
    for seq in (1, 2):
        killed.emit(LogEvent(seq=seq, message=f"event {seq}"))
    killed.close()
    with path.open("a") as f:
        f.write('{"type": "log", "seq": 3, "mess')          # the write a SIGKILL cut off

    resumed = JsonlSink(path)
    assert last_seq(path) == 2
    resumed.emit(LogEvent(seq=3, message="resumed"))
    resumed.close()
    assert [(e.seq, e.message) for e in read_jsonl(path)] == [
        (1, "event 1"), (2, "event 2"), (3, "resumed")]
