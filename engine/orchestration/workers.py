"""The kinds of actor a run places: rollout workers, the learner and PPO's critic.

    RolloutWorker(cfg, policy_dir, model_dir, devices)   engine + reward + tokenizer
        .produce(step, problems, seed) -> groups           [spans: rollout, reward]
                                    a multi-turn task: trajectories [spans: rollout, env]
        .continue_groups(step, groups, target, seed)       partial rollout (APRIL); of a
                                                           multi-turn task: trajectories
        .setup_weight_receiver(...); .receive_weights(ticket, step) -> Served
                                                           [span: weight_sync]
        .evaluate(...), .preflight(...), .sleep(), .wake_up(), .reward_metrics(),
        .prefix_stats(),
        .drain_logs()
    LearnerWorker(cfg, policy_dir, model_dir, devices, checkpoint)
        .update(samples, step, advantages) -> metrics      [span: learner]  version += 1
        .token_logprobs(rows)                              that update's learner logprobs
                                    PPO: the critic first, on the same devices [span: critic]
                                    (or advantages from the CriticWorker)
        .setup_sender(...); .connect(); .prepare(step) -> ticket; .transfer();
        .sent_fingerprint(step) -> WeightMeta
                                                           [span: weight_sync]
        .save_checkpoint(root, keep, critic_state, files)   files: the driver's (data.json)
    CriticWorker(cfg, policy_dir, model_dir, devices, checkpoint)  PPO, critic_devices = 1
        .estimate(samples, step, version) -> advantages    [span: critic]   values, GAE
        .train(step, version) -> critic/*                  [span: critic]   beside the
                                                           learner's update of that step
        .save_state(root, step) -> where it saved          the learner moves it in
    all: .drain_spans() -> (closed, running)             (its own clock and devices)
          .sample_devices() -> device/* metrics            (NVML on GPUs, else the process)

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
from engine.faults import (
    dies_at,
    resets_version,
    sharpen_policy,
    wrap_env,
    wrap_reward,
    wrap_rollout,
)
from engine.learner.batch import pack
from engine.learner.checkpoint import restore_checkpoint, save_checkpoint
from engine.learner.learner import Learner
from engine.learner.ppo import Critic, PpoLearner, critic_source
from engine.model import load_critic, load_policy, load_tokenizer, stop_token_ids
from engine.orchestration.actors import concurrent
from engine.orchestration.evaluation import evaluate
from engine.orchestration.partial import PartialGroup, continue_groups, continue_trajectories
from engine.orchestration.producer import RolloutProducer, TrajectoryProducer
from engine.reward import build_reward, service_metrics
from engine.rollout import DTYPES, build_rollout
from engine.rollout.base import SamplingParams
from engine.rollout.multiturn import TrajectoryRunner
from engine.rollout.preflight import check_logprob_semantics
from engine.seeds import seed_everything
from engine.tasks import task_for
from engine.tasks.base import Problem
from engine.tasks.env import EnvTask
from engine.telemetry.contention import probe_rate
from engine.telemetry.devices import DeviceSampler
from engine.telemetry.recorder import SpanRecorder
from engine.weightsync.session import WeightReceiverHost, WeightSenderHost


def sampling_params(cfg: RunConfig, stop_ids: tuple[int, ...] = ()) -> SamplingParams:
    """``stop_ids``: what ends a completion besides EOS (engine.model.stop_token_ids)."""
    r = cfg.rollout
    return SamplingParams(temperature=r.temperature, top_p=r.top_p,
                          max_new_tokens=r.max_new_tokens, stop_token_ids=stop_ids)


def native_backend(cfg: RunConfig) -> str | None:
    """The vLLM weight-transfer backend the rollout engine starts with, if any."""
    ws = cfg.weight_sync
    return ws.backend if ws.type == "vllm_native" else None


class Telemetered:
    """An actor's own spans (``self.rec``) and device samples (``self.sampler``), read on
    the telemetry concurrency group so they never wait behind a long call. Every kind of
    actor is one, so the driver reads them all alike (Deployment.each)."""

    @concurrent("telemetry")
    def drain_spans(self):
        return self.rec.drain()

    @concurrent("telemetry")
    def sample_devices(self) -> dict[str, float]:
        return self.sampler.sample()

    def corun_probe(self, rows: int, weight_bytes: int, seconds: float) -> float | None:
        """The co-run probe's stand-in workload on this actor's threads: passes/s
        (engine.telemetry.contention)."""
        return probe_rate(rows, weight_bytes, seconds)


class RolloutWorker(Telemetered, WeightReceiverHost):
    def __init__(self, cfg: RunConfig, policy_dir: Path, model_dir: Path, devices: list[str],
                 threads: int | None = None):
        if threads is not None:
            torch.set_num_threads(threads)
        seed_everything(cfg.model.seed)
        self.cfg, self.rec, self.sampler = cfg, SpanRecorder(devices), DeviceSampler(devices)
        self.tok = load_tokenizer(model_dir, cfg.model.trust_remote_code)
        self.task = task_for(cfg, self.tok)
        self.step = 0                     # the step in progress, which faults key on
        self.engine = wrap_rollout(
            build_rollout(cfg.rollout, policy_dir, cfg.model.dtype, cfg.model.seed,
                          native_backend(cfg), cfg.model.trust_remote_code),
            cfg.faults, lambda: self.step)
        # (level, message): what the parts say (at start; reward errors as they happen)
        self.logs: list[tuple[str, str]] = []
        self._prefix_kept = (0, 0)        # prefix_stats read before an eval, for the step
        self.reward = wrap_reward(build_reward(cfg.reward, self.task, log=self._log),
                                  cfg.faults, lambda: self.step)
        self.params = sampling_params(cfg, stop_token_ids(self.tok, model_dir))
        if isinstance(self.task, EnvTask):
            self.producer = TrajectoryProducer(
                TrajectoryRunner(self.engine, self.task, self.tok, self.params, self.rec,
                                 log=self._log,
                                 wrap=lambda env: wrap_env(env, cfg.faults, lambda: self.step)),
                cfg.algorithm.group_size)
        else:
            self.producer = RolloutProducer(self.engine, self.reward, self.tok, self.params,
                                            cfg.algorithm.group_size, self.rec)

    def produce(self, step: int, problems: list[Problem], seed: int) -> list[list[Sample]]:
        self.step = step
        dies_at(self.cfg.faults, step)
        return self.producer.produce(step, problems, seed)

    def continue_groups(self, step: int, groups: list[PartialGroup], target: int,
                        seed: int) -> tuple[list[list[Sample]], list[PartialGroup]]:
        self.step = step
        dies_at(self.cfg.faults, step)
        if isinstance(self.producer, TrajectoryProducer):
            return continue_trajectories(self.producer.runner, groups, target, seed, step)
        return continue_groups(self.engine, self.reward, self.tok, self.params, groups,
                               target, seed, step, self.rec)

    def evaluate(self, temperature: float, seed: int, samples: int) -> dict[str, float]:
        """The held-out eval; its multi-turn turns stay out of prefix_stats (the step's)."""
        kept = self.prefix_stats()
        try:
            return evaluate(self.engine, self.task, self.tok, temperature,
                            self.cfg.rollout.max_new_tokens, seed=seed, samples=samples,
                            stop_token_ids=self.params.stop_token_ids)
        finally:
            self.prefix_stats()                  # the eval's own, dropped
            self._prefix_kept = kept

    def preflight(self, policy_dir: Path, seed: int):
        """Compare this engine's logprobs with a recompute by the policy in ``policy_dir``
        (the weights both start from)."""
        prompts = [p.prompt for p in self.task.train_problems(-1, 8, stream="preflight")]
        full = self.params
        params = SamplingParams(temperature=full.temperature, top_p=full.top_p,
                                max_new_tokens=min(8, full.max_new_tokens),
                                stop_token_ids=full.stop_token_ids)
        policy = load_policy(policy_dir, DTYPES[self.cfg.model.dtype],
                             self.cfg.model.trust_remote_code)
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

    def prefix_stats(self) -> tuple[int, int]:
        """The engine's prefix-cache tokens since the last call, (taken, in all); (0, 0)
        for an engine that counts none."""
        stats = getattr(self.engine, "prefix_stats", None)
        taken, fed = stats() if stats is not None else (0, 0)
        (kept_taken, kept_fed), self._prefix_kept = self._prefix_kept, (0, 0)
        return taken + kept_taken, fed + kept_fed

    def sleep(self) -> bool:
        """Colocated: free the engine's device memory while the learner trains, where the
        backend can (vLLM sleep mode on GPU; the torch sampler its prefix cache)."""
        return self.engine.sleep()

    def wake_up(self) -> None:
        self.engine.wake_up()

    def close(self) -> None:
        self.close_receiver()
        close_reward = getattr(self.reward, "close", None)
        if close_reward is not None:
            close_reward()


class LearnerWorker(Telemetered, WeightSenderHost):
    """The learner, or with ``world`` > 1 one rank of an FSDP2-sharded learner
    (engine.learner.sharded). Rank 0 is the one the loop calls: it forwards each
    collective call (update, the weight gather of a sync, checkpoints) to the other ranks,
    given by ``attach_peers``, and gathers their spans and device samples; to the loop a
    sharded learner is one actor. The ranks meet at ``rendezvous`` (a file:// URL on their
    node: one bundle holds them all)."""

    def __init__(self, cfg: RunConfig, policy_dir: Path, model_dir: Path, devices: list[str],
                 checkpoint: Path | None = None, threads: int | None = None, rank: int = 0,
                 world: int = 1, rendezvous: str | None = None):
        if threads is not None:
            torch.set_num_threads(threads)
        seed_everything(cfg.model.seed)
        dtype = DTYPES[cfg.model.dtype]
        alg = cfg.algorithm
        remote = cfg.model.trust_remote_code
        reference = load_policy(model_dir, dtype, remote) if alg.kl_coef > 0 else None
        policy = load_policy(policy_dir, dtype, remote)
        self.peers: list = []
        self.world = world
        args = (alg, cfg.rollout.temperature, cfg.model.seed)
        kw = {"reference": reference, "setup": cfg.learner,
              "norm_tokens": cfg.rollout.max_new_tokens, "top_p": cfg.rollout.top_p}
        if world > 1:
            from engine.learner.sharded import ShardedLearner, restore_sharded_checkpoint

            init_process_group(cfg, rank, world, rendezvous)
            self.learner = ShardedLearner(policy, *args, **kw)
            if checkpoint is not None:
                restore_sharded_checkpoint(checkpoint, self.learner)
        else:
            if alg.type == "ppo" and not cfg.placement.critic_devices:
                critic = load_critic(critic_source(alg, policy_dir, checkpoint), dtype, remote)
                self.learner = PpoLearner(policy, critic, *args, **kw)
            else:
                self.learner = Learner(policy, *args, **kw)
            if checkpoint is not None:
                restore_checkpoint(checkpoint, self.learner)
        self.pad_id = load_tokenizer(model_dir, remote).pad_token_id
        self.cfg, self.model_dir, self.rec = cfg, model_dir, SpanRecorder(devices)
        self.sampler = DeviceSampler(devices)

    def attach_peers(self, peers: list) -> None:
        """Rank 0: the handles of ranks 1..N-1, in rank order."""
        self.peers = peers

    def _with_peers(self, method, *args) -> list:
        return [p.call(method, *args) for p in self.peers]

    def state(self) -> tuple[int, int]:
        return self.learner.step, self.learner.version

    def update(self, samples: list[Sample], step: int,
               advantages: torch.Tensor | None = None) -> dict[str, float]:
        """``advantages``: (B, R) per token, from a critic on its own bundle; else the
        samples' own (GRPO), or this learner's critic's (PPO, critic_devices = 0)."""
        peers = self._with_peers(LearnerWorker.update, samples, step)
        batch, metrics = pack(samples, self.pad_id), {}
        if isinstance(self.learner, PpoLearner):
            with self.rec.phase("critic", step, self.learner.version):
                advantages, metrics = self.learner.update_critic(batch)
        with self.rec.phase("learner", step, self.learner.version):
            metrics |= self.learner.update(batch, advantages)
        if resets_version(self.cfg.faults, step):
            self.learner.version = 1
        sharpen_policy(self.learner.policy, self.cfg.faults, step)
        for f in peers:
            f.result()
        return metrics

    def token_logprobs(self, rows: list[int]) -> list[list[float]]:
        """Rows of the last update's recomputed logprobs (rank 0 recomputes the whole batch)."""
        return self.learner.token_logprobs(rows)

    def set_lr(self, lr: float) -> float:
        """Every rank's optimizer takes ``lr`` from the next step; returns the previous."""
        peers = self._with_peers(LearnerWorker.set_lr, lr)
        previous = self.learner.lr
        self.learner.set_lr(lr)
        for f in peers:
            f.result()
        return previous

    def sync_version(self) -> int:
        return self.learner.version

    def sync_weights(self) -> tuple[int, list[tuple[str, torch.Tensor]]]:
        peers = self._with_peers(LearnerWorker.gather_weights)
        named = self.learner.named_tensors()          # sharded: a gather every rank joins
        for f in peers:
            f.result()
        return self.learner.version, named

    def gather_weights(self) -> None:
        """A peer's part of rank 0's gather of the full weights."""
        self.learner.named_tensors()

    def save_checkpoint(self, root: Path, keep_last: int, critic_state: Path | None = None,
                        files: dict[str, str] | None = None) -> tuple[str, int, int, str]:
        """``critic_state``: a CriticWorker's save_state for this step (moved in);
        ``files``: the driver's, written into the checkpoint before it counts."""
        if self.world > 1:
            from engine.learner.sharded import save_sharded_checkpoint

            peers = self._with_peers(LearnerWorker.save_checkpoint, root, keep_last)
            path, fp = save_sharded_checkpoint(root, self.learner, self.model_dir, keep_last,
                                               files)
            for f in peers:
                f.result()
        else:
            path = save_checkpoint(root, self.learner, self.model_dir, keep_last,
                                   critic_state, files)
            fp = self.learner.fingerprint()
        return str(path), self.learner.step, self.learner.version, fp

    @concurrent("telemetry")
    def drain_spans(self):
        peers = self._with_peers(LearnerWorker.drain_spans)
        closed, running = self.rec.drain()
        for f in peers:
            c, r = f.result()
            closed, running = closed + c, running + r
        return closed, running

    @concurrent("telemetry")
    def sample_devices(self) -> dict[str, float]:
        peers = self._with_peers(LearnerWorker.sample_devices)
        out = self.sampler.sample()
        for f in peers:
            out |= f.result()
        return out

    def close(self) -> None:
        self.close_sender()


class CriticWorker(Telemetered):
    """PPO's critic on a bundle of its own (placement.critic_devices = 1): the learner's
    update of step s and the critic's training on that step's batch run at once, on two
    bundles, after the critic's values gave the learner its advantages:

        critic   [estimate: values, GAE][train: value epochs          ]
        learner  ......................[update: recompute, actor epochs]
    """

    def __init__(self, cfg: RunConfig, policy_dir: Path, model_dir: Path, devices: list[str],
                 checkpoint: Path | None = None, threads: int | None = None):
        if threads is not None:
            torch.set_num_threads(threads)
        seed_everything(cfg.model.seed)
        alg, remote = cfg.algorithm, cfg.model.trust_remote_code
        model = load_critic(critic_source(alg, policy_dir, checkpoint), DTYPES[cfg.model.dtype],
                            remote)
        self.critic = Critic(model, alg, cfg.model.seed, cfg.learner, cfg.rollout.max_new_tokens)
        if checkpoint is not None:
            self.critic.restore_optimizer(checkpoint)
        self.pad_id = load_tokenizer(model_dir, remote).pad_token_id
        self.rec, self.sampler = SpanRecorder(devices), DeviceSampler(devices)
        self._targets = None      # (batch, old values, returns) between estimate and train

    def estimate(self, samples: list[Sample], step: int, version: int) -> torch.Tensor:
        """(B, R) the actor's advantages for ``samples``, on the CPU (they travel)."""
        batch = pack(samples, self.pad_id)
        with self.rec.phase("critic", step, version):
            adv, old, returns = self.critic.estimate(batch)
        self._targets = (batch, old, returns)
        return adv.cpu()

    def train(self, step: int, version: int) -> dict[str, float]:
        """The value update on the batch of the last ``estimate``; critic/* metrics."""
        batch, old, returns = self._targets
        self._targets = None
        with self.rec.phase("critic", step, version):
            return self.critic.train(batch, old, returns, step)

    def save_state(self, root: Path, step: int) -> Path:
        """The critic's state beside the checkpoints (a name pruning never touches), for
        the learner's save_checkpoint of ``step`` to move in."""
        d = Path(root) / f".critic_step_{step:06d}"
        d.mkdir(parents=True, exist_ok=True)
        self.critic.save(d)
        return d

    def close(self) -> None:
        pass


def init_process_group(cfg: RunConfig, rank: int, world: int, rendezvous: str) -> None:
    """The sharded learner's group: NCCL where the learner trains on CUDA, else gloo."""
    import torch.distributed as dist

    from engine.learner.device import resolve_device

    backend = "nccl" if resolve_device(cfg.learner.device).type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=rendezvous, rank=rank, world_size=world)
