"""The two kinds of actor a run places: rollout workers and the learner.

    RolloutWorker(cfg, policy_dir, model_dir, devices)   engine + reward + tokenizer
        .produce(step, problems, seed) -> groups           [spans: rollout, reward]
        .continue_groups(step, groups, target, seed)       partial rollout (APRIL)
        .load_in_place(version, tensors) -> Served          [span: weight_sync]
        .setup_weight_receiver(...); .receive_weights(ticket) -> Served   (two-sided)
        .evaluate(...), .preflight(...), .sleep(), .wake_up(), .reward_metrics(),
        .drain_logs()
    LearnerWorker(cfg, policy_dir, model_dir, devices, checkpoint)
        .update(samples, step) -> metrics                  [span: learner]  version += 1
        .publish(step) -> (WeightMeta, tensors)            [span: weight_sync]
        .setup_sender(...); .connect(); .prepare(step) -> (WeightMeta, ticket); .transfer()
        .save_checkpoint(root, keep)
    both: .drain_spans() -> (closed, running)             (its own clock and devices)

Plain classes: the driver runs them in its own process or as Ray actors on their
placement-group bundles (engine.orchestration.actors), unchanged. This module is the one
place the rollout engine and the reward are built (a fault-injecting wrapper is one line
in RolloutWorker.__init__).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.config import RunConfig, WeightSyncConfig
from engine.experience import Sample
from engine.faults import resets_version, wrap_reward, wrap_rollout
from engine.learner.batch import pack
from engine.learner.checkpoint import restore_checkpoint, save_checkpoint
from engine.learner.learner import Learner
from engine.orchestration.evaluation import evaluate
from engine.orchestration.partial import PartialGroup, continue_groups
from engine.orchestration.producer import RolloutProducer
from engine.reward import build_reward, service_metrics
from engine.rollout import DTYPES, build_rollout
from engine.rollout.base import SamplingParams, WeightReport
from engine.rollout.preflight import check_logprob_semantics
from engine.tasks import build_task
from engine.tasks.base import Problem
from engine.telemetry.recorder import SpanRecorder
from engine.tinymodel import load_policy, load_tokenizer
from engine.weightsync import build_receiver, build_sender
from engine.weightsync.base import Ticket


def sampling_params(cfg: RunConfig) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(temperature=r.temperature, top_p=r.top_p,
                          max_new_tokens=r.max_new_tokens)


def native_backend(cfg: RunConfig) -> str | None:
    """The vLLM weight-transfer backend the rollout engine starts with, if any."""
    ws = cfg.weight_sync
    return ws.backend if ws.type == "vllm_native" else None


@dataclass(frozen=True)
class Served:
    """A rollout worker's report after loading weights, and when it began serving them."""
    report: WeightReport
    at: float


@dataclass(frozen=True)
class WeightMeta:
    version: int
    fingerprint: str


class RolloutWorker:
    def __init__(self, cfg: RunConfig, policy_dir: Path, model_dir: Path, devices: list[str],
                 threads: int | None = None):
        if threads is not None:
            torch.set_num_threads(threads)
        torch.manual_seed(cfg.model.seed)
        self.cfg, self.rec = cfg, SpanRecorder(devices)
        self.tok = load_tokenizer(model_dir)
        self.task = build_task(cfg.task)
        self.step = 0                     # the step in progress, which faults key on
        self.engine = wrap_rollout(
            build_rollout(cfg.rollout, policy_dir, cfg.model.dtype, cfg.model.seed,
                          native_backend(cfg)),
            cfg.faults, lambda: self.step)
        self.logs: list[str] = []         # what the parts say at start; the driver emits them
        self.reward = wrap_reward(build_reward(cfg.reward, self.task, log=self.logs.append),
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

    def load_in_place(self, version: int, tensors: list[tuple[str, torch.Tensor]],
                      step: int) -> Served:
        """In process: copy the learner's own tensors into the engine's."""
        self.step = step
        with self.rec.phase("weight_sync", step, version):
            report = self.engine.load_weights(tensors, version)
        return Served(report, time.time())

    def setup_weight_receiver(self, cfg: WeightSyncConfig, join_info: object,
                              rank: int) -> None:
        self.receiver = build_receiver(cfg, join_info, rank, self.engine)

    def receive_weights(self, ticket: Ticket, step: int) -> Served:
        """Through a two-sided transport (engine.weightsync): the learner's ticket."""
        self.step = step
        with self.rec.phase("weight_sync", step, ticket.version):
            report = self.receiver.receive(ticket, self.engine)
        return Served(report, time.time())

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

    def drain_logs(self) -> list[str]:
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

    def drain_spans(self):
        return self.rec.drain()

    def close(self) -> None:
        if hasattr(self, "receiver"):
            self.receiver.close()
        close_reward = getattr(self.reward, "close", None)
        if close_reward is not None:
            close_reward()


class LearnerWorker:
    def __init__(self, cfg: RunConfig, policy_dir: Path, model_dir: Path, devices: list[str],
                 checkpoint: Path | None = None, threads: int | None = None):
        if threads is not None:
            torch.set_num_threads(threads)
        torch.manual_seed(cfg.model.seed)
        dtype = DTYPES[cfg.model.dtype]
        alg = cfg.algorithm
        reference = load_policy(model_dir, dtype) if alg.kl_coef > 0 else None
        self.learner = Learner(load_policy(policy_dir, dtype), alg, cfg.rollout.temperature,
                               cfg.model.seed, reference=reference, setup=cfg.learner)
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

    def publish(self, step: int) -> tuple[WeightMeta, list[tuple[str, torch.Tensor]]]:
        """In process: the learner's own tensors, which the in-place copy reads."""
        with self.rec.phase("weight_sync", step, self.learner.version):
            meta = WeightMeta(self.learner.version, self.learner.fingerprint())
            return meta, self.learner.named_tensors()

    def setup_sender(self, cfg: WeightSyncConfig, world_size: int) -> object:
        """The learner's end of a two-sided transport; returns what receivers join with."""
        self.sender = build_sender(cfg, world_size)
        return self.sender.join_info()

    def connect(self) -> None:
        self.sender.connect()

    def prepare(self, step: int, initial: bool) -> tuple[WeightMeta, Ticket]:
        with self.rec.phase("weight_sync", step, self.learner.version):
            meta = WeightMeta(self.learner.version, self.learner.fingerprint())
            return meta, self.sender.prepare(self.learner.named_tensors(), meta.version,
                                             initial)

    def transfer(self, step: int) -> None:
        with self.rec.phase("weight_sync", step, self.learner.version):
            self.sender.transfer()

    def save_checkpoint(self, root: Path, keep_last: int) -> tuple[str, int, int, str]:
        path = save_checkpoint(root, self.learner, self.model_dir, keep_last)
        return str(path), self.learner.step, self.learner.version, self.learner.fingerprint()

    def drain_spans(self):
        return self.rec.drain()

    def close(self) -> None:
        if hasattr(self, "sender"):
            self.sender.close()
