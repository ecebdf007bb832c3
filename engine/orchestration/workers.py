"""The two kinds of actor a run places: rollout workers and the learner.

    RolloutWorker(cfg, policy_dir, model_dir, devices)   engine + reward + tokenizer
        .produce(step, problems, seed) -> groups           [spans: rollout, reward]
        .continue_groups(step, groups, target, seed)       partial rollout (APRIL)
        .setup_weight_receiver(...); .receive_weights(ticket, step) -> Served
                                                           [span: weight_sync]
        .evaluate(...), .preflight(...), .sleep(), .wake_up(), .reward_metrics(),
        .drain_logs()
    LearnerWorker(cfg, policy_dir, model_dir, devices, checkpoint)
        .update(samples, step) -> metrics                  [span: learner]  version += 1
        .setup_sender(...); .connect(); .prepare(step) -> (WeightMeta, ticket); .transfer()
                                                           [span: weight_sync]
        .save_checkpoint(root, keep)
    both: .drain_spans() -> (closed, running)             (its own clock and devices)

The weight-sync methods come from engine.weightsync.session (WeightSenderHost,
WeightReceiverHost), which the session drives for every transport.

Plain classes: the loop runs them in its own process or as Ray actors on their
placement-group bundles (engine.orchestration.actors), unchanged. This module is the one
place the rollout engine and the reward are built (a fault-injecting wrapper is one line
in RolloutWorker.__init__).
"""

from __future__ import annotations

from pathlib import Path

import torch

from engine.config import RunConfig
from engine.experience import Sample
from engine.faults import resets_version, wrap_reward, wrap_rollout
from engine.learner.batch import pack
from engine.learner.checkpoint import restore_checkpoint, save_checkpoint
from engine.learner.learner import Learner
from engine.orchestration.actors import concurrent
from engine.orchestration.evaluation import evaluate
from engine.orchestration.partial import PartialGroup, continue_groups
from engine.orchestration.producer import RolloutProducer
from engine.reward import build_reward, service_metrics
from engine.rollout import DTYPES, build_rollout
from engine.rollout.base import SamplingParams
from engine.rollout.preflight import check_logprob_semantics
from engine.seeds import seed_everything
from engine.tasks import task_for
from engine.tasks.base import Problem
from engine.telemetry.recorder import SpanRecorder
from engine.tinymodel import load_policy, load_tokenizer
from engine.weightsync.session import WeightReceiverHost, WeightSenderHost


def sampling_params(cfg: RunConfig) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(temperature=r.temperature, top_p=r.top_p,
                          max_new_tokens=r.max_new_tokens)


def native_backend(cfg: RunConfig) -> str | None:
    """The vLLM weight-transfer backend the rollout engine starts with, if any."""
    ws = cfg.weight_sync
    return ws.backend if ws.type == "vllm_native" else None


class RolloutWorker(WeightReceiverHost):
    def __init__(self, cfg: RunConfig, policy_dir: Path, model_dir: Path, devices: list[str],
                 threads: int | None = None):
        if threads is not None:
            torch.set_num_threads(threads)
        seed_everything(cfg.model.seed)
        self.cfg, self.rec = cfg, SpanRecorder(devices)
        self.tok = load_tokenizer(model_dir)
        self.task = task_for(cfg, self.tok)
        self.step = 0                     # the step in progress, which faults key on
        self.engine = wrap_rollout(
            build_rollout(cfg.rollout, policy_dir, cfg.model.dtype, cfg.model.seed,
                          native_backend(cfg)),
            cfg.faults, lambda: self.step)
        # (level, message): what the parts say (at start; reward errors as they happen)
        self.logs: list[tuple[str, str]] = []
        self.reward = wrap_reward(build_reward(cfg.reward, self.task, log=self._log),
                                  cfg.faults, lambda: self.step)
        self.params = sampling_params(cfg)
        self.producer = RolloutProducer(self.engine, self.reward, self.tok, self.params,
                                        cfg.algorithm.group_size, self.rec)

    def produce(self, step: int, problems: list[Problem], seed: int) -> list[list[Sample]]:
        self.step = step
        return self.producer.produce(step, problems, seed)

    def continue_groups(self, step: int, groups: list[PartialGroup], target: int,
                        seed: int) -> tuple[list[list[Sample]], list[PartialGroup]]:
        self.step = step
        return continue_groups(self.engine, self.reward, self.tok, self.params, groups,
                               target, seed, step, self.rec)

    def evaluate(self, temperature: float, seed: int, samples: int) -> dict[str, float]:
        return evaluate(self.engine, self.task, self.tok, temperature,
                        self.cfg.rollout.max_new_tokens, seed=seed, samples=samples)

    def preflight(self, policy_dir: Path, seed: int):
        """Compare this engine's logprobs with a recompute by the policy in ``policy_dir``
        (the weights both start from)."""
        prompts = [p.prompt for p in self.task.train_problems(-1, 8, stream="preflight")]
        full = sampling_params(self.cfg)
        params = SamplingParams(temperature=full.temperature, top_p=full.top_p,
                                max_new_tokens=min(8, full.max_new_tokens))
        policy = load_policy(policy_dir, DTYPES[self.cfg.model.dtype])
        return check_logprob_semantics(self.engine, policy, self.tok, prompts, params,
                                       self.tok.pad_token_id, seed)

    def _log(self, message: str, level: str = "info") -> None:
        self.logs.append((level, message))

    @concurrent("telemetry")     # beside an in-flight produce: never waits for generation
    def drain_logs(self) -> list[tuple[str, str]]:
        """(level, message) said since the last call; the loop logs them each step."""
        logs, self.logs = self.logs, []
        return logs

    def reward_metrics(self) -> dict[str, float]:
        """The reward service's metrics since the last call (latency, queue, outcomes)."""
        return service_metrics(self.reward)

    def sleep(self) -> bool:
        """Colocated: free the engine's device memory while the learner trains, where the
        backend can (vLLM sleep mode on GPU; the torch sampler holds nothing)."""
        return self.engine.sleep()

    def wake_up(self) -> None:
        self.engine.wake_up()

    @concurrent("telemetry")
    def drain_spans(self):
        return self.rec.drain()

    def close(self) -> None:
        self.close_receiver()
        close_reward = getattr(self.reward, "close", None)
        if close_reward is not None:
            close_reward()


class LearnerWorker(WeightSenderHost):
    def __init__(self, cfg: RunConfig, policy_dir: Path, model_dir: Path, devices: list[str],
                 checkpoint: Path | None = None, threads: int | None = None):
        if threads is not None:
            torch.set_num_threads(threads)
        seed_everything(cfg.model.seed)
        dtype = DTYPES[cfg.model.dtype]
        alg = cfg.algorithm
        reference = load_policy(model_dir, dtype) if alg.kl_coef > 0 else None
        self.learner = Learner(load_policy(policy_dir, dtype), alg, cfg.rollout.temperature,
                               cfg.model.seed, reference=reference)
        if checkpoint is not None:
            restore_checkpoint(checkpoint, self.learner)
        self.pad_id = load_tokenizer(model_dir).pad_token_id
        self.cfg, self.model_dir, self.rec = cfg, model_dir, SpanRecorder(devices)

    def state(self) -> tuple[int, int]:
        return self.learner.step, self.learner.version

    def update(self, samples: list[Sample], step: int) -> dict[str, float]:
        with self.rec.phase("learner", step, self.learner.version):
            metrics = self.learner.update(pack(samples, self.pad_id))
        if resets_version(self.cfg.faults, step):
            self.learner.version = 1
        return metrics

    def sync_weights(self) -> tuple[int, list[tuple[str, torch.Tensor]]]:
        return self.learner.version, self.learner.named_tensors()

    def save_checkpoint(self, root: Path, keep_last: int) -> tuple[str, int, int, str]:
        path = save_checkpoint(root, self.learner, self.model_dir, keep_last)
        return str(path), self.learner.step, self.learner.version, self.learner.fingerprint()

    @concurrent("telemetry")
    def drain_spans(self):
        return self.rec.drain()

    def close(self) -> None:
        self.close_sender()
