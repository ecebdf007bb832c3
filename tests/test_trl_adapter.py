"""rlplane.adapters.trl driven by TRL's own GRPOTrainer (TRL 1.16.0) on CPU: a tiny
random Llama and its tokenizer built here (tests/engine/hf_models.py; nothing downloaded),
two- and three-step runs whose reports land in a recorder standing in for rlplane.track.

Two trainings are shared by the module's tests (TRL's import is most of the time):

    learning   texts, a reward that varies, 2 steps: the metrics, spans and samples
    flat       chat prompts, a constant reward, 3 steps asked, stopped from "rlplane"
               once its first step ends
"""

import importlib.util
import signal
import sys
import types
from pathlib import Path

import pytest
from datasets import Dataset
from transformers import TrainerControl, TrainerState
from trl import GRPOConfig, GRPOTrainer

import rlplane
from rlplane.adapters.trl import RlplaneCallback

from .engine.hf_models import build_hf_model

PROMPTS = ["1+2=", "4+5=", "The answer is", "def f(x):"]


class Recorder:
    """A run as rlplane.track's init returns it, keeping what it was told."""

    def __init__(self, stop_after_steps: int | None = None):
        self.metrics: dict[int, dict[str, float]] = {}
        self.spans: list[tuple[str, str, int]] = []
        self.rows: dict[int, list[dict]] = {}
        self.finished: tuple[str, str] | None = None
        self.stop_after_steps = stop_after_steps

    @property
    def stop_requested(self) -> bool:
        return self.stop_after_steps is not None and len(self.spans) >= self.stop_after_steps

    def log(self, step, metrics):
        self.metrics.setdefault(step, {}).update(metrics)

    def span(self, phase, device, step, *, start, end):
        assert start <= end
        self.spans.append((phase, device, step))

    def samples(self, step, rows):
        self.rows.setdefault(step, []).extend(rows)

    def finish(self, status="succeeded", reason=""):
        self.finished = (status, reason)


def varying_reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


def constant_reward(completions, **kwargs):
    return [1.0] * len(completions)


def train(model_dir, out_dir, prompts, reward, max_steps, run) -> GRPOTrainer:
    config = GRPOConfig(
        output_dir=str(out_dir), max_steps=max_steps, per_device_train_batch_size=4,
        num_generations=2, max_completion_length=6, beta=0.04,   # beta > 0: TRL logs kl
        logging_steps=1, log_completions=True, num_completions_to_print=0, report_to=[],
        use_cpu=True, bf16=False, save_strategy="no", disable_tqdm=True, seed=0)
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=reward, args=config,
                          train_dataset=Dataset.from_dict({"prompt": prompts}))
    trainer.add_callback(RlplaneCallback(trainer, run=run))
    trainer.train()
    return trainer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_hf_model(tmp_path_factory.mktemp("llama"), "llama")


@pytest.fixture(scope="module")
def learning(model_dir, tmp_path_factory):
    run = Recorder()
    train(model_dir, tmp_path_factory.mktemp("learning"), PROMPTS, varying_reward, 2, run)
    return run


@pytest.fixture(scope="module")
def flat(model_dir, tmp_path_factory):
    run = Recorder(stop_after_steps=1)
    chats = [[{"role": "user", "content": p}] for p in PROMPTS]
    trainer = train(model_dir, tmp_path_factory.mktemp("flat"), chats, constant_reward, 3, run)
    return run, trainer


def test_each_step_reports_trls_own_metric_names(learning):
    assert set(learning.metrics) == {1, 2}
    for step in (1, 2):
        m = learning.metrics[step]
        assert {"reward", "reward_std", "frac_reward_zero_std", "kl", "entropy", "loss",
                "completions/mean_length", "completions/clipped_ratio", "step_time"} <= set(m)
        assert 0 < m["completions/mean_length"] <= 6
        assert m["step_time"] > 0
    assert learning.finished == ("succeeded", "")


def test_each_step_is_a_span_on_the_trainers_device(learning):
    assert learning.spans == [("learner", "cpu:0", 1), ("learner", "cpu:0", 2)]


def test_completions_arrive_as_samples_with_trls_rewards(learning):
    assert set(learning.rows) == {1, 2}   # the end-of-training log repeats step 2: sent once
    for step, rows in learning.rows.items():
        assert len(rows) == 4              # the generation batch: 2 prompts x 2 completions
        assert {row["prompt"] for row in rows} <= set(PROMPTS)
        assert [row["group"] for row in rows] == [0, 0, 1, 1]
        assert rows[0]["prompt"] == rows[1]["prompt"] != rows[2]["prompt"] == rows[3]["prompt"]
        for row in rows:
            assert row["reward"] == len(row["completion"])    # varying_reward's score
        mean = sum(row["reward"] for row in rows) / len(rows)
        assert mean == pytest.approx(learning.metrics[step]["reward"])


def test_a_constant_reward_logs_the_flat_signal(flat):
    run, _ = flat
    for m in run.metrics.values():
        assert m["reward"] == 1.0
        assert m["reward_std"] == 0.0
        assert m["frac_reward_zero_std"] == 1.0
    assert all(row["advantage"] == 0.0 for rows in run.rows.values() for row in rows)


def test_chat_completions_arrive_as_text(flat):
    run, _ = flat
    rows = run.rows[1]
    assert {row["prompt"] for row in rows} <= {f"user: {p}" for p in PROMPTS}
    assert all(row["completion"].startswith("assistant: ") for row in rows)


def test_a_stop_from_rlplane_ends_training_after_the_current_step(flat):
    run, trainer = flat
    assert trainer.state.global_step == 1          # of max_steps=3
    assert set(run.metrics) == {1}                 # the stopped step is still logged
    assert run.finished == ("stopped", "stop requested from rlplane")


class Unreachable:
    stop_requested = False

    def log(self, step, metrics):
        raise ConnectionError("control plane gone")


def test_a_failing_run_never_raises_into_training():
    callback = RlplaneCallback(run=Unreachable())
    args = GRPOConfig(output_dir="unused", use_cpu=True, report_to=[])
    for step in (1, 2):
        callback.on_log(args, TrainerState(global_step=step), TrainerControl(),
                        logs={"reward": 1.0})
    assert callback.errors == 2


def test_without_a_run_it_starts_one_from_the_environment(monkeypatch):
    run = Recorder()
    track = types.SimpleNamespace(init=lambda: run)
    monkeypatch.setitem(sys.modules, "rlplane.track", track)
    monkeypatch.setattr(rlplane, "track", track, raising=False)
    callback = RlplaneCallback()
    args = GRPOConfig(output_dir="unused", use_cpu=True, report_to=[])
    state, control = TrainerState(global_step=0), TrainerControl()
    callback.on_train_begin(args, state, control)
    callback.on_log(args, state, control, logs={"reward": 0.5, "epoch": 0.0})
    assert callback.run is run
    assert run.metrics == {0: {"reward": 0.5, "epoch": 0.0}}


def test_the_example_script_reports_a_run_and_finishes_it(tmp_path, monkeypatch):
    """examples/trl_grpo.py, the command rlplane launches as a Ray job, run in-process for
    one step with its run standing in for the one RLPLANE_* would name."""
    run = Recorder()
    track = types.SimpleNamespace(init=lambda: run)
    monkeypatch.setitem(sys.modules, "rlplane.track", track)
    monkeypatch.setattr(rlplane, "track", track, raising=False)
    path = Path(__file__).parents[1] / "examples" / "trl_grpo.py"
    spec = importlib.util.spec_from_file_location("trl_grpo_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    monkeypatch.setattr(example, "track", track)
    sigterm = signal.getsignal(signal.SIGTERM)     # main() installs its own
    try:
        example.main(["--steps", "1", "--constant-reward", "--output-dir", str(tmp_path)])
    finally:
        signal.signal(signal.SIGTERM, sigterm)
    assert run.metrics[1]["frac_reward_zero_std"] == 1.0
    assert len(run.rows[1]) == 4
    assert run.finished == ("succeeded", "")
