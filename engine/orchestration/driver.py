"""The run driver: builds the parts from a RunConfig and runs the RL loop.

    warm start (cached) -> learner + rollout engine -> initial weight sync (version 0)
    eval (held-out) ->
    for step:
        groups  = policy.next_batch(step, version)       rollout + reward   [spans]
        adv     = group_advantages(rewards)
        metrics = learner.update(pack(groups))            version += 1       [span]
        result  = transport.push(weights, version, fp)    rollout reports fp [span]
        emit metrics.append (spans -> bubble, rollout_share), weight_sync.report
    eval -> final checkpoint -> run.status

It is what a Ray job runs (and what the CLI runs in process). A SIGTERM, a STOP file in
the run directory or a ``stop_requested()`` callback answering True makes it checkpoint
after the step in progress and exit "stopped".
"""

from __future__ import annotations

import random
import signal
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from engine.api import (
    CheckpointEvent,
    EventSink,
    LogEvent,
    MetricsEvent,
    RunStatusEvent,
    RunSummary,
    WeightSyncEvent,
)
from engine.config import RunConfig, dump_config
from engine.experience import ExperienceBuffer, Sample
from engine.faults import wrap_buffer, wrap_reward, wrap_rollout, wrap_transport
from engine.learner.batch import pack
from engine.learner.checkpoint import latest_checkpoint, restore_checkpoint, save_checkpoint
from engine.learner.learner import Learner
from engine.learner.losses import group_advantages
from engine.learner.warmstart import ensure_warm_start
from engine.orchestration.evaluation import evaluate
from engine.orchestration.placement import layout_for
from engine.orchestration.policies import SyncPolicy
from engine.orchestration.producer import RolloutProducer, step_seed
from engine.reward import build_reward
from engine.rollout import DTYPES, build_rollout
from engine.rollout.base import SamplingParams
from engine.rollout.preflight import PreflightError, check_logprob_semantics
from engine.tasks import build_task
from engine.telemetry.recorder import Telemetry
from engine.telemetry.sinks import FanoutSink, JsonlSink, MemorySink, read_jsonl
from engine.tinymodel import load_policy, load_tokenizer
from engine.weightsync.inplace import InPlaceTransport


def percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q))


class RunDriver:
    def __init__(self, cfg: RunConfig, out_dir: Path, sink: EventSink | None = None,
                 progress=None, stop_requested: Callable[[], bool] | None = None):
        self.cfg, self.out_dir, self.progress = cfg, Path(out_dir), progress
        self._stop_hook = stop_requested  # asked after each step, like the STOP file
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.memory = MemorySink()
        jsonl = JsonlSink(self.out_dir / "events.jsonl") if cfg.telemetry.jsonl else None
        self.layout = layout_for(cfg.placement)
        self.tel = Telemetry(FanoutSink(self.memory, jsonl, sink), self.layout.devices)
        self._stop = threading.Event()

    # ------------------------------------------------------------------ setup

    def status(self, status: str, message: str = "") -> None:
        self.tel.emit(RunStatusEvent(status=status, message=message))

    def _build(self, resume: bool) -> None:
        cfg = self.cfg
        random.seed(cfg.model.seed)
        np.random.seed(cfg.model.seed)
        torch.manual_seed(cfg.model.seed)
        (self.out_dir / "config.toml").write_text(dump_config(cfg))
        self.status("warm_start")
        self.model_dir = ensure_warm_start(cfg, log=self.tel.log)
        self.ckpt_root = self.out_dir / "checkpoints"
        ckpt = latest_checkpoint(self.ckpt_root) if resume else None
        policy_dir = ckpt or self.model_dir
        dtype = DTYPES[cfg.model.dtype]
        self.tok = load_tokenizer(self.model_dir)
        alg = cfg.algorithm
        reference = load_policy(self.model_dir, dtype) if alg.kl_coef > 0 else None
        self.learner = Learner(load_policy(policy_dir, dtype), alg, cfg.rollout.temperature,
                               cfg.model.seed, reference=reference)
        if ckpt is not None:
            restore_checkpoint(ckpt, self.learner)
            self.tel.log(f"resumed from {ckpt.name} (step {self.learner.step}, "
                         f"version {self.learner.version})")
        step = lambda: self.learner.step  # noqa: E731 -- faults key on the step in progress
        self.engine = wrap_rollout(
            build_rollout(cfg.rollout, policy_dir, cfg.model.dtype, cfg.model.seed),
            cfg.faults, step)
        self.transport = wrap_transport(InPlaceTransport(self.engine), self.engine,
                                        self.learner, cfg.faults)
        self.task = build_task(cfg.task)
        self.params = SamplingParams(temperature=cfg.rollout.temperature,
                                     top_p=cfg.rollout.top_p,
                                     max_new_tokens=cfg.rollout.max_new_tokens)
        producer = RolloutProducer(
            self.engine, self.task, wrap_reward(build_reward(cfg.reward, self.task), cfg.faults,
                                                step), self.tok, self.params,
            cfg.rollout.prompts_per_step, alg.group_size, cfg.model.seed, self.layout, self.tel)
        self.buffer = wrap_buffer(ExperienceBuffer(), cfg.faults, step)
        self.policy = SyncPolicy(producer, self.buffer)
        self._sync(self.learner.step, time.time())       # the engine serves version N
        self._preflight()

    def _preflight(self) -> None:
        prompts = [p.prompt for p in self.task.train_problems(-1, 8, stream="preflight")]
        params = SamplingParams(temperature=self.params.temperature, top_p=self.params.top_p,
                                max_new_tokens=min(8, self.params.max_new_tokens))
        res = check_logprob_semantics(self.engine, self.learner.policy, self.tok, prompts,
                                      params, self.tok.pad_token_id, self.cfg.model.seed)
        if res.skipped:
            return
        msg = (f"preflight at T={params.temperature}: engine logprobs differ from the learner's "
               f"tempered recompute by <= {res.gap_tempered:.2e}, untempered by <= "
               f"{res.gap_untempered:.2e}")
        if res.scaled:
            self.tel.log(msg)
            return
        fix = ('set rollout.logprobs_mode = "processed_logprobs"'
               if self.cfg.rollout.type == "vllm" else "the rollout backend returns raw logprobs")
        text = f"{msg}: logprobs are NOT temperature-scaled; {fix}"
        if self.cfg.rollout.preflight == "error":
            raise PreflightError(text + ' (rollout.preflight = "warn" only warns)')
        self.tel.log(text, level="warning")

    def _sync(self, step: int, ready_at: float):
        with self.tel.phase("weight_sync", self.layout.devices, step, self.learner.version):
            res = self.transport.push(self.learner.named_tensors(), self.learner.version,
                                      self.learner.fingerprint(), ready_at)
        self.tel.emit(WeightSyncEvent(
            step=step, transport=res.transport, version_learner=res.version_learner,
            version_rollout=res.version_rollout, fingerprint_learner=res.fingerprint_learner,
            fingerprint_rollout=res.fingerprint_rollout, matched=res.matched,
            latency_s=res.latency_s, bytes=res.bytes))
        if not res.matched:
            self.tel.log(f"weight sync v{res.version_learner} did not apply: rollout serves "
                         f"v{res.version_rollout} fingerprint {res.fingerprint_rollout}, "
                         f"learner sent {res.fingerprint_learner}", level="error")
        return res

    def _eval(self, step: int) -> dict[str, float]:
        t = self.cfg.telemetry.eval_temperature
        temp = self.cfg.rollout.temperature if t is None else t
        values = evaluate(self.engine, self.task, self.tok, temp,
                          self.cfg.rollout.max_new_tokens, seed=step_seed(self.cfg.model.seed, -1),
                          samples=self.cfg.telemetry.eval_samples)
        self.tel.emit(MetricsEvent(step=step, values=values))
        return values

    def _checkpoint(self) -> None:
        path = save_checkpoint(self.ckpt_root, self.learner, self.model_dir,
                               self.cfg.checkpoint.keep_last)
        self.tel.emit(CheckpointEvent(step=self.learner.step, version=self.learner.version,
                                      path=str(path), fingerprint=self.learner.fingerprint()))

    # ------------------------------------------------------------------ the loop

    def request_stop(self) -> None:
        self._stop.set()

    def _stop_requested(self) -> bool:
        if self._stop.is_set() or (self.out_dir / "STOP").exists():
            return True
        if self._stop_hook is not None and self._stop_hook():
            self._stop.set()  # the answer is final: the end-of-run status must agree
            return True
        return False

    def _step(self, step: int) -> dict[str, float]:
        t0 = time.time()
        version_at_update = self.learner.version
        groups = self.policy.next_batch(step, version_at_update)
        samples: list[Sample] = [s for g in groups for s in g]
        rewards = torch.tensor([s.reward for s in samples])
        adv = group_advantages(rewards, self.cfg.algorithm.group_size,
                               self.cfg.algorithm.normalize_std)
        for s, a in zip(samples, adv.tolist(), strict=True):
            s.advantage = a
        with self.tel.phase("learner", self.layout.learner, step, version_at_update):
            m = self.learner.update(pack(samples, self.tok.pad_token_id))
        res = self._sync(step, time.time())
        t1 = time.time()
        m.update(self.tel.step_metrics(t0, t1))
        lengths = [len(s.response_ids) for s in samples]
        staleness = [version_at_update - s.version for s in samples]
        tokens = sum(lengths)
        m.update({
            "reward/mean": float(rewards.mean()),
            "reward/std": float(rewards.std(unbiased=False)),
            "reward/accuracy": float((rewards == 1.0).float().mean()),
            "response_length/mean": statistics.fmean(lengths),
            "response_length/p50": percentile(lengths, 50),
            "response_length/p99": percentile(lengths, 99),
            "response_length/max": float(max(lengths)),
            "response/finished_frac": sum(s.finished for s in samples) / len(samples),
            "throughput/tokens_per_s": tokens / m["time/step_s"],
            "rollout/tokens_per_s": tokens / max(m["time/rollout_s"], 1e-9),
            "staleness/mean": statistics.fmean(staleness),
            "staleness/max": float(max(staleness)),
            "buffer/dropped_stale": float(self.buffer.dropped_stale),
            "weight_sync/latency_s": res.latency_s,
            "weight_sync/bytes": float(res.bytes),
            "weight_sync/gbps": res.bytes * 8 / 1e9 / max(res.latency_s, 1e-9),
            "weight_sync/version_learner": float(res.version_learner),
            "weight_sync/version_rollout": float(res.version_rollout),
            "weight_sync/matched": float(res.matched),
        })
        self.tel.emit(MetricsEvent(step=step, values=m))
        return m

    def run(self, steps: int | None = None, resume: bool = False) -> RunSummary:
        cfg, start = self.cfg, time.time()
        total = steps if steps is not None else cfg.steps
        prev = signal.getsignal(signal.SIGTERM) if _main_thread() else None
        if prev is not None:
            signal.signal(signal.SIGTERM, lambda *_: self.request_stop())
        if resume:
            # A resumed run is the same run to its consumers, which dedup by seq: continue
            # the sequence instead of restarting it (or every new event reads as a replay).
            self.tel.seq = last_seq(self.out_dir / "events.jsonl")
        self.status("starting")
        status, last, eval_before, eval_after = "failed", {}, {}, {}
        try:
            self._build(resume)
            self.status("running")
            eval_before = self._eval(self.learner.step)
            rl_start = time.time()
            while self.learner.step < total:
                step = self.learner.step
                last = self._step(step)
                if self.progress:
                    self.progress(step + 1, total, last)
                every = cfg.telemetry.eval_every_steps
                if every and (step + 1) % every == 0 and step + 1 < total:
                    self._eval(step + 1)
                if cfg.checkpoint.every_steps and (step + 1) % cfg.checkpoint.every_steps == 0:
                    self._checkpoint()
                if self._stop_requested():
                    break
                if cfg.max_seconds is not None and time.time() - rl_start > cfg.max_seconds:
                    self.tel.log(f"max_seconds={cfg.max_seconds} reached after step {step + 1}")
                    break
            eval_after = self._eval(self.learner.step)
            self._checkpoint()
            status = "stopped" if self._stop_requested() else "succeeded"
        except KeyboardInterrupt:
            status = "stopped"
            raise
        except Exception as exc:
            self.tel.emit(LogEvent(level="error", message=f"{type(exc).__name__}: {exc}"))
            raise
        finally:
            self.status(status)
            self.tel.sink.close()
            if prev is not None:
                signal.signal(signal.SIGTERM, prev)
        return RunSummary(status=status, steps_done=self.learner.step, eval_before=eval_before,
                          eval_after=eval_after, last_metrics=last, out_dir=str(self.out_dir),
                          wall_s=time.time() - start)


def last_seq(path: Path) -> int:
    """The highest seq in an events.jsonl (0 when there is none)."""
    if not path.exists():
        return 0
    return max((e.seq for e in read_jsonl(path)), default=0)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
