"""Every injected fault makes the real loop misbehave, and the control plane's rules name
it within 3 steps of its onset (a short real run on the tiny model per fault)."""

import copy
import threading

import pytest
import torch

from engine.api import run_local
from engine.config import ConfigError, validate_config
from engine.experience import ExperienceBuffer, Sample
from engine.faults import OverrunBuffer, untempered_logprobs, wrap_rollout
from engine.learner.batch import pack, response_logprobs
from engine.rollout.base import SamplingParams
from engine.tasks.base import Problem
from jobs.alerts.history import RunFacts, Thresholds

from .alert_watch import AlertWatch
from .conftest import small_run

ONSET = 2
TEMPERATURE = 0.7


def fault_run(tmp_path, faults: dict, steps: int = ONSET + 3, thresholds=None, **overrides):
    """A real run with the fault injected and the rules attached; returns the watch."""
    rollout = {"temperature": TEMPERATURE, **overrides.pop("rollout", {})}
    cfg = small_run(steps=steps, faults=faults, warm_start={"steps": 60, "batch_size": 32},
                    rollout=rollout, **overrides)
    watch = AlertWatch(RunFacts.from_config(cfg, "running"), thresholds)
    run_local(cfg, tmp_path, sink=watch)
    return watch


def assert_caught(watch: AlertWatch, kind: str, words: str):
    hit = watch.first(kind)
    assert hit is not None, f"{kind} never fired; fired: {sorted(watch.kinds())}"
    step, finding = hit
    assert ONSET <= step <= ONSET + 2, f"{kind} fired at step {step}, onset {ONSET}"
    assert words in finding.cause, finding.cause
    assert finding.runbook and finding.evidence["series"]["values"]
    print(f"\n{kind}: fired at step {step}, {step - ONSET} steps after onset: {finding.cause}")
    return step


# --------------------------------------------------------------------------- unit seams

def test_faults_are_off_by_default_and_bounded():
    cfg = small_run()
    assert all(v is None for v in cfg.faults.model_dump().values())
    with pytest.raises(ConfigError) as exc:
        validate_config({"faults": {"straggler": {"seconds": -1}}})
    assert exc.value.errors[0][0] == "faults.straggler.seconds"


def test_unscaled_logprobs_is_refused_for_vllm_with_the_real_knob_named():
    with pytest.raises(ConfigError) as exc:
        validate_config({"rollout": {"type": "vllm"}, "faults": {"unscaled_logprobs": {}}})
    assert "raw_logprobs" in str(exc.value)


def test_unscaled_logprobs_are_the_untempered_distributions(tiny_dir):
    from engine.model import load_policy
    from engine.rollout.torch_backend import TorchRollout

    engine = TorchRollout.from_pretrained(tiny_dir)
    faulty = wrap_rollout(engine, small_run(faults={"unscaled_logprobs": {}}).faults, lambda: 5)
    prompts = [[1, 5, 6, 7], [1, 8, 9]]
    params = SamplingParams(temperature=0.5, max_new_tokens=6)
    outs = faulty.generate(prompts, params, seed=3)
    policy = load_policy(tiny_dir, torch.float32).eval()
    samples = [Sample(Problem("", ""), p, o.token_ids, o.logprobs, o.finished, 0, 0)
               for p, o in zip(prompts, outs, strict=True)]
    batch = pack(samples, engine.pad_id)
    with torch.no_grad():
        raw, _ = response_logprobs(policy, batch, 1.0)
        tempered, _ = response_logprobs(policy, batch, 0.5)
    mask = batch.response_mask.bool()
    assert torch.allclose(batch.behaviour_logp[mask], raw[mask], atol=1e-4)
    assert not torch.allclose(batch.behaviour_logp[mask], tempered[mask], atol=1e-2)
    assert untempered_logprobs(engine, prompts, outs) == [o.logprobs for o in outs]


def group(version: int) -> list[Sample]:
    return [Sample(Problem("p", "1"), [1], [2], [0.0], True, version, 0)]


def test_the_overrun_buffer_admits_groups_the_bound_would_drop():
    honest, faulty = ExperienceBuffer(max_staleness=1), OverrunBuffer(
        ExperienceBuffer(max_staleness=1), from_step=0, lag=1, step=lambda: 5)
    for buf in (honest, faulty):
        for v in (1, 4, 5):
            buf.put(group(v))
    assert [g[0].version for g in honest.take(3, learner_version=5)] == [4, 5]
    assert [g[0].version for g in faulty.take(3, learner_version=5)] == [1, 4, 5]
    assert faulty.inner.max_staleness == 1 and faulty.dropped_stale == 0

def test_a_slow_reward_keeps_a_pool_streaming_and_delays_its_collect(monkeypatch):
    from engine import faults
    from engine.reward import service_metrics
    from engine.reward.service import RewardService
    from engine.reward.verdict import Verdict

    class Pool(RewardService):                 # the pool at its seam: no Ray actors
        streaming = True

        def submit(self, i, problem, text, finished):
            self.record(Verdict(1.0, "pass"), 0.0, 0.0, 0.5)

        def collect(self, n):
            return [Verdict(1.0, "pass")] * n

    slept: list[float] = []
    monkeypatch.setattr(faults.time, "sleep", slept.append)
    cfg = validate_config({"faults": {"slow_reward": {"from_step": 2, "seconds": 3.0}}})
    step = 1
    pool = faults.wrap_reward(Pool("rule"), cfg.faults, lambda: step)

    assert pool.streaming                               # the producer still streams to it
    assert copy.copy(pool).streaming                    # delegation survives copy/pickle
    pool.submit(0, Problem("1+1=", "2"), "2", True)
    pool.collect(1)
    step = 2
    pool.collect(1)

    assert slept == [3.0]                               # from the onset step on
    assert service_metrics(pool)["reward/latency_s_p50"] == 0.5



# --------------------------------------------------------------------------- caught

@pytest.mark.slow
def test_skip_weight_sync_is_caught_as_a_desync(tmp_path):
    watch = fault_run(tmp_path, {"skip_weight_sync": {"from_step": ONSET}})
    assert_caught(watch, "WeightSyncDesync", "the generator is not receiving new weights")
    assert all(step >= ONSET for step, _ in watch.fired)


@pytest.mark.slow
def test_sleep_dropping_weights_is_caught_as_a_desync(tmp_path):
    watch = fault_run(tmp_path, {"sleep_drops_weights": {"from_step": ONSET}})
    assert_caught(watch, "WeightSyncDesync", "serves other weights than the learner's")


@pytest.mark.slow
@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_unscaled_logprobs_are_caught_as_a_temperature_bug(tmp_path, top_p):
    # With top_p < 1 the learner's recompute is the nucleus renormalized, and the raw
    # logprobs still match only log_softmax(logits): no temperature, no top-p.
    watch = fault_run(tmp_path, {"unscaled_logprobs": {"from_step": ONSET}},
                      rollout={"top_p": top_p})
    assert_caught(watch, "TemperatureLogprobs", "not temperature-scaled")


@pytest.mark.slow
def test_a_version_reset_is_caught_as_a_regression(tmp_path):
    watch = fault_run(tmp_path, {"version_reset": {"at_step": ONSET}})
    assert_caught(watch, "VersionRegression", "went backwards")


@pytest.mark.slow
def test_a_staleness_overrun_is_caught(tmp_path):
    watch = fault_run(tmp_path, {"staleness_overrun": {"from_step": ONSET, "lag": 2}})
    assert_caught(watch, "StalenessOverBound", "versions old were trained on")


@pytest.mark.slow
def test_a_straggler_is_caught_as_rollout_bound_steps(tmp_path):
    # A 5 s straggler against a 2 s floor (the default floor is 5 s: a 15 s straggler
    # took 30 s of sleep here); the rule's test is the same: p99 over 5x the p50.
    watch = fault_run(tmp_path, {"straggler": {"from_step": ONSET, "seconds": 5.0}},
                      steps=ONSET + 2, thresholds=Thresholds(straggler_min_s=2.0))
    step = assert_caught(watch, "BubbleHigh", "stragglers hold every batch")
    runbook = watch.first("BubbleHigh")[1].runbook
    assert "placement.ray = true" in runbook and '"partial_rollout"' in runbook  # in process
    assert step <= ONSET + 2
    # the same run against its own first healthy step: throughput fell, in rollout
    _, slowed = watch.first("ThroughputRegression")
    assert slowed.step <= ONSET + 2 and "most of it in rollout" in slowed.cause, slowed.cause


@pytest.mark.slow
def test_a_slow_reward_stage_is_caught(tmp_path):
    # 4 s of reward a step against a 60 % share (the default 90 % wanted 10 s a step)
    watch = fault_run(tmp_path, {"slow_reward": {"from_step": ONSET, "seconds": 4.0}},
                      steps=ONSET + 2, thresholds=Thresholds(reward_share_max=0.6))
    assert_caught(watch, "BubbleHigh", "the reward stage takes")
    assert_caught(watch, "ThroughputRegression", "most of it in reward")


@pytest.mark.slow
def test_a_hung_weight_sync_is_caught_while_it_hangs(tmp_path):
    thresholds = Thresholds(hang_factor=10.0, hang_min_s=2.0)
    cfg = small_run(steps=ONSET + 2, warm_start={"steps": 60, "batch_size": 32},
                    faults={"sync_hang": {"at_step": ONSET, "seconds": 8.0}})
    watch = AlertWatch(RunFacts.from_config(cfg, "running"), thresholds)
    done = threading.Event()
    runner = threading.Thread(target=lambda: (run_local(cfg, tmp_path, sink=watch), done.set()))
    runner.start()
    hang = None
    while not done.wait(0.25) and hang is None:
        hang = next((f for f in watch.poll() if f.kind == "PhaseHang"), None)
    synced_steps = {s.step for s in watch.history.syncs}
    runner.join()
    assert hang is not None, "PhaseHang never fired during an 8 s hang"
    # Caught while the sync was still hung: its weight_sync report had not arrived.
    assert ONSET not in synced_steps
    assert hang.cause.startswith("Stuck in weight_sync on cpu:0")
    ev = hang.evidence["values"]
    assert ev["stalled_s"] > max(thresholds.hang_factor * ev["median_s"], thresholds.hang_min_s)
    print(f"\nPhaseHang: fired during the hang, after {ev['stalled_s']:.1f} s stalled "
          f"(median {ev['median_s']:.3f} s, factor {ev['factor']:g}): {hang.cause}")
    # Once the sync completes, its latency stands out against the run's own median.
    assert watch.first("ResyncSlow") is not None


def test_a_straggler_is_one_late_sample_that_the_step_metrics_show(tiny_dir):
    from engine.config import ArithmeticTaskConfig, RuleRewardConfig
    from engine.model import load_tokenizer
    from engine.orchestration.producer import RolloutProducer
    from engine.reward import build_reward
    from engine.rollout.torch_backend import TorchRollout
    from engine.tasks import ArithmeticTask
    from engine.telemetry.recorder import SpanRecorder
    from engine.telemetry.step_metrics import sample_metrics

    seconds = 0.5
    engine = wrap_rollout(TorchRollout.from_pretrained(tiny_dir),
                          small_run(faults={"straggler": {"seconds": seconds}}).faults,
                          lambda: 1)
    task = ArithmeticTask(ArithmeticTaskConfig(max_digits=1))
    producer = RolloutProducer(engine, build_reward(RuleRewardConfig(), task),
                               load_tokenizer(tiny_dir), SamplingParams(max_new_tokens=4), 4,
                               SpanRecorder(["cpu:0"]))

    samples = [s for g in producer.produce(1, task.train_problems(0, 4), seed=0) for s in g]

    times = sorted(s.gen_s for s in samples)
    assert len(times) == 16 and times[0] >= 0.0
    assert times[-1] >= times[-2] + seconds      # the last one waited the straggler's delay
    m = sample_metrics(samples, [0] * len(samples))
    assert m["rollout/gen_s_max"] == times[-1] and m["rollout/gen_s_p50"] < m["rollout/gen_s_p99"]


@pytest.mark.slow
def test_output_faults_are_caught_each_by_its_rule_with_its_cause(tmp_path):
    """One run for the faults in what the policy writes (the CI budget has room for one):
    inflated behaviour logprobs on most tokens, a policy sharpened 20x, generation that
    never stops. Each rule names its own fault; the rule-level tests
    (tests/jobs/test_alerts_outputs.py) show each apart from the others."""
    # the update of step ONSET - 1 sharpens the policy: ONSET's rollouts are the first
    # it writes, and learner/entropy shows it from ONSET on
    watch = fault_run(tmp_path, {"importance_collapse": {"from_step": ONSET},
                                 "entropy_collapse": {"at_step": ONSET - 1, "factor": 50.0},
                                 "no_stop": {"from_step": ONSET}},
                      steps=ONSET + 2, rollout={"max_new_tokens": 8})
    assert_caught(watch, "ImportanceWeightCollapse", "the importance ratio")
    assert_caught(watch, "EntropyCollapse", "Policy entropy collapsed")
    assert_caught(watch, "LengthBlowup", "growing into the cap")
    _, cut = watch.first("NonTermination")
    assert_caught(watch, "NonTermination", "never emitted the stop token")
    assert cut.evidence["samples"]["step"] >= ONSET
    assert watch.first("ImportanceWeightCollapse")[1].key == "ImportanceWeightCollapse:ratio"
    before = [f.kind for s, f in watch.fired if s < ONSET]
    assert before == [], before
