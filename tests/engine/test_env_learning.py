"""The calculator environment learns on the tiny model: configs/calculator_env.toml for 20
steps, fixed seed, held-out success and tool-call rate before vs after.

Measured on a 2-core machine (2026-12-03; runs are deterministic for a given environment):
the 100-step warm start (cached) leaves sampled held-out accuracy at 0.031 and the share of
held-out trajectories that call the calculator at 0.609; after 20 GRPO steps they are 0.438
and 0.781 (greedy accuracy 0.688 -> 0.750). The module took 43 s from a cold cache (the
base model and the warm start built); the run alone ~20 s on an idle machine, and ~480 s
while other processes held the 2 cores (load 5-8). With the learner's update disabled by
hand (each minibatch step's parameter change undone) the same run ends where it began
(0.031 and 0.609), and the test fails.
"""

import pytest

from .alert_watch import assert_quiet
from .preset_runs import preset_run

PRESET, STEPS = "calculator_env.toml", 20


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


@pytest.mark.slow
def test_the_calculator_env_learning_run_raises_no_alert(tmp_path, model_cache, capsys):
    """The learning run above (the same one, run once) raises no alert at all. (Once, with
    other processes taking the machine mid-run, ThroughputRegression rightly saw the
    learner's step go from 1.96 to 6.58 s.)"""
    assert_quiet(preset_run(PRESET, STEPS, tmp_path).watch, PRESET, STEPS, capsys)
