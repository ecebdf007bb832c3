"""Every async policy x both placements: a short GRPO run on Ray with logical GPUs.

One local Ray instance (2 CPUs, 4 logical GPUs) for the module; each run places its
learner and rollout worker as actors in a placement group, runs three steps of the tiny
model and tears them down.
"""

import pytest

from engine.api import (
    LogEvent,
    MetricsEvent,
    SamplesEvent,
    SpanEvent,
    WeightSyncEvent,
    run_local,
)
from engine.config import EnvTaskConfig, validate_config
from engine.model import load_tokenizer
from engine.rollout.base import SamplingParams
from engine.rollout.multiturn import Trajectory, TrajectoryRunner
from engine.tasks.env import EnvTask
from engine.telemetry.recorder import SpanRecorder
from engine.telemetry.sinks import MemorySink

from .conftest import small_run
from .test_envs import ScriptedEngine

pytestmark = pytest.mark.slow

PLACEMENTS = {
    "colocated": {"type": "colocated", "ray": True},
    "disaggregated": {"type": "disaggregated"},
}
TRANSPORT = {"colocated": "shm", "disaggregated": "object_store"}
POLICIES = {                               # policy table, its staleness bound
    "sync": ({"type": "sync"}, 0),
    "one_step_off": ({"type": "one_step_off"}, 1),
    "partial_rollout": ({"type": "partial_rollout", "over_provision": 2.0}, 2),
    "fully_async": ({"type": "fully_async", "max_staleness": 0, "on_stale": "drop"}, 0),
}
# A random-init policy runs every row to the token budget, so all groups end together and
# nothing is left to recycle; a few supervised steps teach it EOS after the short answers.
LENGTHS_VARY = {"steps": 10, "batch_size": 16}


def step_metrics(events):
    return [e.values for e in events if isinstance(e, MetricsEvent) and "staleness/max" in e.values]


@pytest.mark.parametrize("placement", PLACEMENTS)
@pytest.mark.parametrize("policy", POLICIES)
def test_each_policy_runs_to_completion_within_its_staleness_bound(
        ray_gpus, tmp_path, model_cache, policy, placement):
    table, bound = POLICIES[policy]
    warm = LENGTHS_VARY if policy == "partial_rollout" else {"steps": 0}
    cfg = small_run(steps=3, placement=PLACEMENTS[placement], async_policy=table,
                    rollout={"max_new_tokens": 8}, warm_start=warm,
                    weight_sync={"type": TRANSPORT[placement]},
                    telemetry={"corun_probe_s": 0.05})
    sink = MemorySink()

    summary = run_local(cfg, tmp_path, sink=sink)

    assert (summary.status, summary.steps_done) == ("succeeded", 3)
    steps = step_metrics(sink.events)
    assert len(steps) == 3
    assert all(0 <= m["staleness/max"] <= bound for m in steps)   # checked every step too
    syncs = [e for e in sink.events if isinstance(e, WeightSyncEvent)]
    assert [s.version_learner for s in syncs] == [0, 1, 2, 3]
    assert all(s.matched and s.transport == TRANSPORT[placement] for s in syncs)
    devices = {"colocated": ["gpu:0"], "disaggregated": ["gpu:0", "gpu:1"]}[placement]
    assert all(f"device/utilization/{d}" in m for d in devices for m in steps)
    # the co-run probe, with every step (engine.telemetry.contention)
    assert all(m[f"host/corun_slowdown/{a}"] > 0 for a in ("learner", "rollout")
               for m in steps)
    spans = [e for e in sink.events if isinstance(e, SpanEvent)]
    rollout_dev, learner_dev = devices[0], devices[-1]
    assert {"rollout", "reward", "weight_sync"} <= {s.phase for s in spans
                                                    if s.device == rollout_dev}
    assert {"learner", "weight_sync"} <= {s.phase for s in spans if s.device == learner_dev}

    later = steps[1:]
    if policy == "one_step_off":
        assert [m["staleness/max"] for m in later] == [1.0, 1.0]
    if policy == "fully_async":
        assert steps[-1]["buffer/dropped_stale"] > 0
    if policy == "partial_rollout":      # generated a step ahead, its tail carried
        assert steps[-1]["buffer/recycled"] > 0
        assert all(m["staleness/max"] >= 1 for m in later)


@pytest.mark.vllm
def test_vllm_rollout_workers_take_weights_through_vllms_own_transfer_api(
        ray_gpus, tmp_path, model_cache):
    """Disaggregated vLLM rollout workers synced by weight_sync.type = "vllm_native": every
    sync runs vLLM's init / start / update / finish lifecycle (gloo backend on CPU), the
    workers' own fingerprints match the learner's, and on-policy logprobs agree."""
    cfg = small_run(steps=3, placement={"type": "disaggregated", "rollout_workers": 2},
                    warm_start={"steps": 0}, rollout={"type": "vllm", "max_new_tokens": 8},
                    weight_sync={"type": "vllm_native", "bucket_mb": 1})
    sink = MemorySink()

    summary = run_local(cfg, tmp_path, sink=sink)

    assert (summary.status, summary.steps_done) == ("succeeded", 3)
    syncs = [e for e in sink.events if isinstance(e, WeightSyncEvent)]
    assert [s.version_learner for s in syncs] == [0, 1, 2, 3]
    assert all(s.matched and s.transport == "vllm_native" for s in syncs)
    assert len({s.fingerprint_rollout for s in syncs}) > 1   # the weights did move
    assert all(m["logprob_gap/max"] < 1e-3 for m in step_metrics(sink.events))   # fp32


def test_a_placed_rollout_workers_reward_pool_joins_the_runs_placement_group(
        ray_gpus, tmp_path, model_cache):
    cfg = small_run(steps=1, placement={"type": "disaggregated"}, warm_start={"steps": 0},
                    rollout={"max_new_tokens": 8}, reward={"workers": 2},
                    weight_sync={"type": "object_store"})
    sink = MemorySink()

    summary = run_local(cfg, tmp_path, sink=sink)

    assert summary.status == "succeeded"
    logs = [e.message for e in sink.events if isinstance(e, LogEvent)]
    pool = next(m for m in logs if m.startswith("reward pool: 2 Ray worker(s)"))
    assert "none" not in pool and "," not in pool          # one group: the run's own


def test_a_trajectory_continues_across_a_weight_sync_on_ray_and_records_both_versions(
        ray_gpus, tmp_path, model_cache):
    """The guessing env (configs/guess_env.toml's law) under partial rollout's synchronous
    form, its rollout worker and learner actors on two bundles: trajectories still
    guessing when the step's groups have ended are carried, and their next turns are
    generated after the weight sync, by the next version. A 10-step warm start teaches
    the tiny model to end a guess with EOS (a random one runs every turn to its budget:
    one turn, nothing to carry). (task.env.workers = "ray", the pool's state round trip
    and errors: the runner test below, ~1 s, instead of this 20 s run a second time.)"""
    cfg = validate_config({
        "name": "guess", "steps": 3,
        "task": {"type": "env", "eval_size": 8,
                 "env": {"class": "guess", "max_turns": 12, "max_tokens": 64,
                         "workers": "thread"}},
        "warm_start": {"steps": 10, "batch_size": 16},
        "algorithm": {"group_size": 2, "minibatches": 1},
        "rollout": {"prompts_per_step": 2, "max_new_tokens": 4},
        "placement": PLACEMENTS["disaggregated"], "weight_sync": {"type": "object_store"},
        "async_policy": {"type": "partial_rollout", "over_provision": 2.0,
                         "overlap": False, "max_staleness": 1},
        "telemetry": {"eval_samples": 1, "eval_every_steps": 0, "sample_groups": 2}})
    sink = MemorySink()

    summary = run_local(cfg, tmp_path, sink=sink)

    assert (summary.status, summary.steps_done) == ("succeeded", 3)
    steps = step_metrics(sink.events)
    assert steps[-1]["buffer/recycled"] > 0
    assert any(m["samples/mixed_versions"] > 0 for m in steps[1:])
    assert all(m["staleness/max"] <= 1 for m in steps)
    syncs = [e for e in sink.events if isinstance(e, WeightSyncEvent)]
    assert all(s.matched for s in syncs) and len(syncs) == 4
    mixed = [s for e in sink.events if isinstance(e, SamplesEvent) for s in e.samples
             if s.last_version > s.version]
    assert mixed and all(s.last_version == s.version + 1 for s in mixed)
    assert all(s.prompt.startswith("guess ") and ("up:" in s.completion
                                                  or "down:" in s.completion) for s in mixed)


def test_env_calls_on_ray_actors_take_the_environment_there_and_bring_its_state_back(
        ray_gpus, tiny_dir):
    """task.env.workers = "ray": every reset, step and close goes through the pool's
    actors; the calculator's reset stores the answer in the copy it ran on, and only that
    copy coming back lets the step score the right answer."""
    tok = load_tokenizer(tiny_dir)
    task = EnvTask(EnvTaskConfig.model_validate({"eval_size": 8, "env": {"workers": "ray"}}))
    (problem,) = task.train_problems(0, 1)
    call, answer = f"{problem.row['a']}*{problem.row['b']}=", problem.row["answer"]
    called = []
    run = TrajectoryRunner(ScriptedEngine(tok, [call, answer]), task, tok,
                           SamplingParams(max_new_tokens=12), SpanRecorder(["cpu:0"]),
                           wrap=lambda env: called.append(type(env).__name__) or env)
    samples = run.samples(run.run([problem], group_size=2, seed=0, step=0))
    assert [(s.reward, s.reason, s.env.turns, s.env.tool_calls, s.env.errors)
            for s in samples] == [(1.0, "correct", 2, 1, 0)] * 2
    assert set(called) == {"RemoteEnv"} and len(called) == 2 * 3     # reset + 2 steps each
    assert task.new_env().answer == ""                 # a fresh one has none of its own
    # what an environment raises there is raised here as itself, as under threads
    with pytest.raises(AttributeError):
        run.pool.proxy(Trajectory(problem, task.new_env(), 0)).step(None)
