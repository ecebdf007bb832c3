"""placement.learner_devices = 2 on Ray: the learner is two FSDP2 ranks (gloo) on its
bundle's two logical GPUs, one actor to the loop. Its weight syncs are served with the
learner's fingerprint, both ranks' devices record learner spans, and a run resumed from
its sharded checkpoint takes the same next step as the uninterrupted one."""

import pytest

from engine.api import SpanEvent, WeightSyncEvent

from .preset_runs import preset_run, resume_last_step, step_values

pytestmark = pytest.mark.slow

SHARDED = {"type": "disaggregated", "rollout_workers": 1, "learner_devices": 2}


# A short run: whether the two ranks' step is the single-process step (and so learns like
# it) is tests/engine/test_learner_sharded.py's (loss, grad norm and weights to 1e-5); here
# the placement around it.
STEPS = 5
NO_EVAL = {"eval_every_steps": 0, "eval_samples": 1}


def test_grpo_with_a_two_rank_learner_syncs_checkpoints_and_resumes(ray_gpus, tmp_path,
                                                                    model_cache):
    """The demo recipe for STEPS steps (no held-out evaluation), its learner two FSDP2
    ranks on Ray: every sync served with the learner's fingerprint, learner spans on both
    ranks' devices, and resumed from its sharded checkpoint a step before the end, it takes
    the same last step as the run that went on. (A 40-step learning run here measured
    held-out mean reward 0.567 -> 0.693 on 2026-11-30, the in-process run's gain; the step
    equivalence above is the sharper check, and this run cost 114 s of CI.)"""
    run = preset_run("demo_arithmetic.toml", STEPS, tmp_path / "run", placement=SHARDED,
                     weight_sync={"type": "shm"}, telemetry=NO_EVAL,
                     checkpoint={"every_steps": STEPS - 1, "keep_last": 2})
    assert run.summary.status == "succeeded", run.summary

    syncs = run.of_type(WeightSyncEvent)
    assert [s.version_learner for s in syncs] == list(range(STEPS + 1))
    assert all(s.matched for s in syncs)
    learner_devices = {s.device for s in run.of_type(SpanEvent) if s.phase == "learner"}
    assert learner_devices == {"gpu:1", "gpu:2"}
    last = STEPS - 1
    assert (run.out / "checkpoints" / f"step_{last:06d}" / "optim").is_dir()

    resumed = step_values(resume_last_step(run, tmp_path / "resumed"), "learner/loss")
    assert list(resumed) == [last]
    assert resumed[last] == pytest.approx(step_values(run.watch, "learner/loss")[last],
                                          abs=1e-6)
