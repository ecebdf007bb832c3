"""The reward pool on a real (small) Ray cluster: streamed submits, back-pressure, metrics;
the served reward model answers in batches and agrees with the verifier."""

import threading

import pytest

from engine.config import (
    ArithmeticTaskConfig,
    CodeTaskConfig,
    RewardModelConfig,
    RuleRewardConfig,
    SandboxRewardConfig,
)
from engine.reward import build_reward
from engine.reward.model import ensure_reward_model, heldout_agreement, start_server
from engine.reward.service import RewardPool
from engine.tasks import ArithmeticTask, CodeTask, Problem

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def cluster(ray_gpus):
    """The test process's local Ray (tests/engine/conftest.py)."""
    return ray_gpus


def test_a_pool_scores_streamed_completions_in_index_order(cluster):
    task = CodeTask(CodeTaskConfig())
    pool = build_reward(SandboxRewardConfig(workers=2, max_in_flight=3), task)
    assert isinstance(pool, RewardPool) and pool.streaming
    problems = task.train_problems(0, 6)
    texts = [p.answer if i % 2 == 0 else "f=lambda x:0" for i, p in enumerate(problems)]
    for i in reversed(range(6)):                       # completions finish in any order
        pool.submit(i, problems[i], texts[i], True)
    assert [v.reward for v in pool.collect(6)] == [1.0, 0.0] * 3
    m = pool.metrics()
    assert m["reward/sandbox/pass"] == 3 and m["reward/sandbox/wrong_answer"] == 3
    assert m["reward/queue_depth_max"] <= 3, "back-pressure keeps in-flight under the bound"
    assert m["reward/latency_s_p99"] >= m["reward/latency_s_p50"] > 0
    pool.close()


def test_a_saturated_pool_makes_submit_wait(cluster):
    task = CodeTask(CodeTaskConfig())
    pool = build_reward(SandboxRewardConfig(workers=1, max_in_flight=1, timeout_s=1.0), task)
    p = Problem("add3=", "f=lambda x:x+3")
    pool.submit(0, p, "while True: pass", True)        # occupies the only slot ~1 s
    second = threading.Thread(target=pool.submit, args=(1, p, p.answer, True))
    second.start()
    second.join(timeout=0.2)
    assert second.is_alive(), "submit returned while the pool was saturated"
    second.join()
    assert [v.reason for v in pool.collect(2)] == ["timeout", "pass"]
    pool.close()


def test_a_rule_pool_scores_like_the_inline_rule(cluster):
    task = ArithmeticTask(ArithmeticTaskConfig(max_digits=1))
    problems = task.train_problems(0, 8)
    texts = [p.answer if i % 3 else "x" for i, p in enumerate(problems)]
    finished = [i != 5 for i in range(8)]
    inline = build_reward(RuleRewardConfig(), task).score(problems, texts, finished)
    pool = build_reward(RuleRewardConfig(workers=2), task)
    assert pool.score(problems, texts, finished) == inline
    pool.close()


@pytest.mark.slow
def test_the_served_reward_model_batches_and_agrees_with_the_verifier(cluster, model_cache):
    """Measured on the code task (300 steps, 2 busy cores): Pearson r = 0.41 between the
    RM's score and the sandbox's verdict on 128 held-out programs, agreement 0.67."""
    cfg = RewardModelConfig(train_steps=300, max_batch=16, batch_wait_ms=20)
    task = CodeTask(CodeTaskConfig())
    server = start_server(ensure_reward_model(cfg, task.cfg), cfg)
    fit = heldout_agreement(task, lambda pairs: ray.get(
        [server.score.remote(p, t) for p, t in pairs]), n_problems=64)
    sizes = ray.get(server.batch_sizes.remote())
    assert sum(sizes) == fit["n"] and max(sizes) > 1, sizes
    assert max(sizes) <= 16
    print(f"RM held-out: {fit}")
    assert fit["pearson_r"] > 0.2, fit
    ray.kill(server)


def test_a_reward_model_run_logs_its_fit_and_the_agreement_metric(cluster, model_cache):
    task = ArithmeticTask(ArithmeticTaskConfig(ops=["+"], min_digits=2, max_digits=2))
    logs = []
    reward = build_reward(RewardModelConfig(train_steps=20, workers=1), task, log=logs.append)
    assert "held-out Pearson r" in logs[0]
    problems = task.train_problems(0, 8)
    texts = [p.answer for p in problems[:4]] + ["1", "2", "3", "x"]
    scores = reward.score(problems, texts, [True] * 8)
    assert all(0.0 <= s <= 1.0 for s in scores)
    m = reward.metrics()
    assert m["reward/verifier_mean"] == pytest.approx((4 * 1.0 + 3 * 0.0 - 0.1) / 8)
    assert 0.0 <= m["reward/rm_vs_verifier_agreement"] <= 1.0
    assert "reward/rm_mean" in m
    reward.close()


class _Generating:
    """The engine, plus a flag that is up while generate() runs (a seam for the test)."""

    def __init__(self, engine):
        self.engine, self.busy = engine, False

    def generate(self, *args, **kwargs):
        self.busy = True
        try:
            return self.engine.generate(*args, **kwargs)
        finally:
            self.busy = False

    def weight_version(self):
        return self.engine.weight_version()


def test_the_producer_streams_completions_to_the_pool_while_generating(cluster, tiny_dir):
    from engine.model import load_tokenizer
    from engine.orchestration.producer import RolloutProducer
    from engine.rollout.base import SamplingParams
    from engine.rollout.torch_backend import TorchRollout
    from engine.telemetry.recorder import SpanRecorder

    engine = _Generating(TorchRollout.from_pretrained(tiny_dir))
    task = ArithmeticTask(ArithmeticTaskConfig(max_digits=1))
    pool = build_reward(RuleRewardConfig(workers=2), task)
    during, submit = [], pool.submit

    def recording_submit(*args):
        during.append(engine.busy)
        submit(*args)

    pool.submit = recording_submit
    producer = RolloutProducer(engine, pool, load_tokenizer(tiny_dir),
                               SamplingParams(max_new_tokens=6), 4, SpanRecorder(["cpu:0"]))
    groups = producer.produce(0, task.train_problems(0, 4), seed=0)
    assert len(during) == 16 and all(during), "every completion went out during generation"
    samples = [s for g in groups for s in g]
    expected = build_reward(RuleRewardConfig(), task).score(
        [s.problem for s in samples], [s.text for s in samples], [s.finished for s in samples])
    assert [s.reward for s in samples] == expected
    pool.close()


@pytest.mark.slow
def test_a_run_with_the_reward_model_logs_it_next_to_the_verifier(cluster, tmp_path):
    from engine.api import LogEvent, MetricsEvent, run_local
    from engine.telemetry.sinks import MemorySink

    from .conftest import small_run

    cfg = small_run(reward={"type": "reward_model", "train_steps": 20, "workers": 1})
    sink = MemorySink()
    assert run_local(cfg, tmp_path, sink=sink).status == "succeeded"
    assert any("held-out Pearson r" in e.message for e in sink.of_type(LogEvent))
    steps = [e.values for e in sink.of_type(MetricsEvent) if "reward/mean" in e.values]
    assert len(steps) == 2
    for m in steps:
        assert 0.0 <= m["reward/rm_vs_verifier_agreement"] <= 1.0
        assert {"reward/rm_mean", "reward/verifier_mean", "reward/share",
                "reward/latency_s_p99", "reward/queue_depth"} <= set(m)
