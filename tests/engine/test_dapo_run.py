"""A real run with DAPO's knobs (dynamic sampling, clip-higher, a sequence-mean loss) on
the arithmetic task: the learner never gets a group whose rewards all agree, the extra
generation is counted, and a resumed run draws and trains as the uninterrupted one."""

import pytest

from engine.api import MetricsEvent, run_local
from engine.telemetry.sinks import MemorySink

from .conftest import small_run

# Partial credit an untrained model earns by chance (a digit anywhere in the completion),
# so groups of two often agree (both 0 or both 1) and often differ.
REWARD = '''
def score(prompt, completion, answer, **row):
    return 1.0 if any(c.isdigit() for c in completion) else 0.0
'''


def _steps(sink: MemorySink) -> dict[int, dict[str, float]]:
    return {e.step: e.values for e in sink.of_type(MetricsEvent) if "learner/loss" in e.values}


@pytest.mark.slow
def test_dynamic_sampling_with_clip_higher_trains_on_varied_groups_and_resumes_exactly(
        tmp_path, model_cache):
    (tmp_path / "digit.py").write_text(REWARD)
    cfg = small_run(steps=3, checkpoint={"every_steps": 1, "keep_last": 5},
                    reward={"type": "python", "function": f"{tmp_path / 'digit.py'}:score"},
                    algorithm={"group_size": 2, "minibatches": 2, "lr": 1e-3,
                               "dynamic_sampling": True, "max_resample_rounds": 8,
                               "clip_eps_low": 0.2, "clip_eps_high": 0.28,
                               "loss_agg_mode": "seq-mean-token-mean"},
                    telemetry={"eval_samples": 1})
    n, group = cfg.rollout.prompts_per_step, cfg.algorithm.group_size

    straight = MemorySink()
    assert run_local(cfg, tmp_path / "straight", sink=straight).status == "succeeded"
    steps = _steps(straight)
    assert sorted(steps) == [0, 1, 2]
    dropped = {k: m["samples/resampled"] / group for k, m in steps.items()}
    for k, m in steps.items():
        # every flat group the step drew was dropped: none reached the learner
        flat = m["samples/zero_std_group_frac"] * (n + dropped[k])
        assert flat == pytest.approx(dropped[k]), k
    assert sum(dropped.values()) > 0, "the run should have met flat groups and drawn more"

    first = MemorySink()
    run_local(cfg, tmp_path / "split", steps=2, sink=first)
    resumed = MemorySink()
    assert run_local(cfg, tmp_path / "split", sink=resumed, resume=True).steps_done == 3
    again = _steps(resumed)[2]
    for key in ("learner/loss", "samples/resampled", "samples/zero_std_group_frac",
                "reward/mean"):
        assert again[key] == steps[2][key], key
