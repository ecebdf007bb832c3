"""The calculator environment learns on the tiny model: configs/calculator_env.toml for 30
steps, fixed seed, held-out success and tool-call rate before vs after.

Runs are deterministic for a given machine, not across CPUs (the kernels' float
reductions differ): on the 2-core machine of 2026-12-03 the 100-step warm start (cached)
left sampled held-out accuracy at 0.031 and the share of held-out trajectories that call
the calculator at 0.609, and 20 GRPO steps took them to 0.438 and 0.781; on the AMD EPYC
2-core machine of 2026-12-04 the same 20 steps took 0.031 / 0.422 to 0.203 / 0.641 (a
gain of 0.172, under this test's 0.2), and 30 steps to 0.266 / 0.719, one torch thread
or two alike. So the run is 30 steps. The module took ~65 s there (the base model and the
warm start built). With the learner's update disabled by hand (each minibatch step's
parameter change undone) the run ends where it began, and the test fails.
"""

import pytest

from .alert_watch import assert_quiet
from .preset_runs import preset_run

PRESET, STEPS = "calculator_env.toml", 30


@pytest.mark.slow
def test_grpo_on_the_calculator_env_raises_held_out_success_and_tool_calls(tmp_path,
                                                                          model_cache):
    run = preset_run(PRESET, STEPS, tmp_path)
    before, after = run.summary.eval_before, run.summary.eval_after
    print(f"\n{PRESET}, {STEPS} steps: accuracy {before['eval/accuracy']:.3f} -> "
          f"{after['eval/accuracy']:.3f}, tool calls {before['eval/tool_call_frac']:.3f} -> "
          f"{after['eval/tool_call_frac']:.3f}")
    assert before["eval/accuracy"] < 0.2, "the warm start should leave room to learn"
    assert after["eval/accuracy"] - before["eval/accuracy"] >= 0.2, (before, after)
    assert after["eval/tool_call_frac"] - before["eval/tool_call_frac"] >= 0.08
    steps = run.metrics()
    assert len(steps) == STEPS and all(m["env/errors"] == 0 for m in steps)
    assert sum(m["env/tool_calls"] for m in steps[-5:]) > sum(m["env/tool_calls"]
                                                             for m in steps[:5])
    # a turn after a tool call is fed only the call's last token and the observation: the
    # rest of its context comes from the torch sampler's prefix cache
    assert all(m["rollout/prefix_hit_frac"] > 0.2 for m in steps if m["env/tool_calls"])


@pytest.mark.slow
def test_the_calculator_env_learning_run_raises_no_alert(tmp_path, model_cache, capsys):
    """The learning run above (the same one, run once) raises no alert at all. (Once, with
    other processes taking the machine mid-run, ThroughputRegression rightly saw the
    learner's step go from 1.96 to 6.58 s.)"""
    assert_quiet(preset_run(PRESET, STEPS, tmp_path).watch, PRESET, STEPS, capsys)
