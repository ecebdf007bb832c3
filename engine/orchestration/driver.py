"""The run driver: builds the parts from a RunConfig and runs the RL loop.

    warm start (cached) -> placement: learner + rollout workers -> weight sync (version N)
    preflight, eval (held-out) ->
    for step:
        groups  = policy.next_batch(step, version)  rollout + reward on the workers [spans]
        check staleness <= the policy's bound       (negative: error event, run fails)
        adv     = group_advantages(rewards)
        metrics = learner.update(samples)           version += 1                   [span]
        weights -> every rollout worker             each reports (version, fp)     [spans]
        emit metrics.append (every actor's spans -> bubble, utilization per device)
    eval -> final checkpoint -> run.status

Where the workers run follows the placement (engine.orchestration.placement):
colocated with ``ray = false`` (the default) runs the learner and one rollout worker in
this process, with no Ray and the in-place weight sync; any other placement reserves a
Ray placement group, refused up front when it cannot fit, and runs each worker as a Ray
actor on its bundle, weights through the configured two-sided transport
(engine.weightsync: shm, object store, broadcast, ...). Every policy runs either way; only
on Ray do generation and training overlap.

It is what a Ray job runs (and what the CLI runs in process). A SIGTERM, a STOP file in
the run directory or a ``stop_requested()`` callback answering True makes it checkpoint
after the step in progress and exit "stopped".
"""

from __future__ import annotations

import os
import random
import signal
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
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
from engine.config import FullyAsyncPolicyConfig, PartialRolloutPolicyConfig, RunConfig, dump_config
from engine.experience import ExperienceBuffer, Sample, StalenessError, check_staleness
from engine.faults import wrap_buffer
from engine.learner.checkpoint import latest_checkpoint
from engine.learner.losses import group_advantages
from engine.learner.warmstart import ensure_warm_start
from engine.orchestration.actors import LocalActor, RayActor
from engine.orchestration.placement import Layout, layout_for, reserve
from engine.orchestration.policies import Experience, build_policy
from engine.orchestration.producer import step_seed
from engine.orchestration.workers import LearnerWorker, RolloutWorker
from engine.reward import reward_metrics
from engine.rollout.preflight import PreflightError
from engine.tasks import build_task
from engine.telemetry.recorder import Telemetry
from engine.telemetry.sinks import FanoutSink, JsonlSink, MemorySink, read_jsonl
from engine.weightsync.base import SyncResult


def percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q))


@dataclass
class PendingSync:
    step: int
    ready_at: float       # when the learner's new version existed
    meta: object          # future -> WeightMeta
    served: list          # futures -> Served, one per rollout worker


class RunDriver:
    def __init__(self, cfg: RunConfig, out_dir: Path, sink: EventSink | None = None,
                 progress=None, stop_requested: Callable[[], bool] | None = None):
        self.cfg, self.out_dir, self.progress = cfg, Path(out_dir), progress
        self._stop_hook = stop_requested  # asked after each step, like the STOP file
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.memory = MemorySink()
        jsonl = JsonlSink(self.out_dir / "events.jsonl") if cfg.telemetry.jsonl else None
        self.layout: Layout = layout_for(cfg.placement)
        self.tel = Telemetry(FanoutSink(self.memory, jsonl, sink), self.layout.devices)
        self._stop = threading.Event()
        self._pg, self._ray_started = None, False
        self.learner = None
        self.workers: list = []
        self.step = self.version = 0
        self.pending: list[PendingSync] = []
        self.last_sync: SyncResult | None = None

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
        self.policy_dir = ckpt or self.model_dir
        self._place(ckpt)
        for w in self.workers:            # e.g. a reward model's held-out fit
            for line in w.call("drain_logs").result():
                self.tel.log(line)
        self.step, self.version = self.learner.call("state").result()
        if ckpt is not None:
            self.tel.log(f"resumed from {ckpt.name} (step {self.step}, "
                         f"version {self.version})")
        self.buffer = wrap_buffer(ExperienceBuffer(max_staleness=_drop_bound(cfg)), cfg.faults,
                                  lambda: self.step)
        self.experience = Experience(self.workers, build_task(cfg.task), self.buffer,
                                     cfg.rollout.prompts_per_step, cfg.algorithm.group_size,
                                     cfg.model.seed, resumed_at=self.step)
        self.policy = build_policy(cfg.async_policy, self.experience, self.version)
        if self.layout.on_ray:
            self._connect_transport()
        self._sync(self.step, initial=True)    # every worker serves version N
        self._settle_syncs(wait=True)
        self._preflight()

    def _place(self, ckpt: Path | None) -> None:
        """Start the learner and the rollout workers where the layout puts them."""
        cfg, lay = self.cfg, self.layout
        learner_args = (cfg, self.policy_dir, self.model_dir, lay.learner.devices, ckpt)
        if not lay.on_ray:
            self.learner = LocalActor(LearnerWorker(*learner_args))
            self.workers = [LocalActor(RolloutWorker(cfg, self.policy_dir, self.model_dir,
                                                     w.devices)) for w in lay.workers]
            self.transport = "in_place"
            self.sharing = self.workers
            if cfg.weight_sync.type != "in_place":
                self.tel.log(f'weight_sync.type = "{cfg.weight_sync.type}" is not used: this '
                             f"placement keeps the rollout engine in the learner's process, "
                             f"so weights are copied in place (placement.ray = true uses it)",
                             level="warning")
            return
        import ray

        if not ray.is_initialized():
            # The job's cluster (RAY_ADDRESS), else a private local one: a bare ray.init()
            # would follow a stale /tmp/ray/ray_current_cluster to a head long gone.
            ray.init(address=os.environ.get("RAY_ADDRESS", "local"))
            self._ray_started = True
        self._pg = reserve(lay, cfg.placement.ready_timeout_s)
        threads = cfg.placement.threads_per_actor
        self.tel.log(f"placed on Ray: {len(lay.workers)} rollout worker(s) + learner in "
                     f"bundles {lay.bundles} ({lay.strategy}), {threads} torch thread(s) "
                     f"per actor")
        self.learner = RayActor.start(LearnerWorker, (*learner_args, threads),
                                      lay.learner.gpus, self._pg, lay.learner.bundle)
        self.workers = [
            RayActor.start(RolloutWorker, (cfg, self.policy_dir, self.model_dir, w.devices,
                                           threads), w.gpus, self._pg, w.bundle)
            for w in lay.workers]
        self.transport = cfg.weight_sync.type
        self.sharing = [h for h, w in zip(self.workers, lay.workers, strict=True)
                        if set(w.devices) & set(lay.learner.devices)]

    def _teardown(self) -> None:
        actors = [h for h in [self.learner, *self.workers] if h is not None]
        if self.layout.on_ray and actors:
            import ray

            # Transports release what they hold (shared-memory files, process groups);
            # bounded, so a wedged actor cannot keep the run from ending.
            closing = [h.call("close").ref for h in actors]
            ray.wait(closing, num_returns=len(closing), timeout=30)
        elif actors:
            for h in actors:              # in process: reward pools stop their actors
                h.call("close").result()
        for h in actors:
            h.kill()
        if self._pg is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._pg)
        if self._ray_started:
            import ray

            ray.shutdown()

    def _preflight(self) -> None:
        res = self.workers[0].call("preflight", self.policy_dir, self.cfg.model.seed).result()
        if res.skipped:
            return
        temp = self.cfg.rollout.temperature
        msg = (f"preflight at T={temp}: engine logprobs differ from the learner's "
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

    # ------------------------------------------------------------------ weight sync

    def _connect_transport(self) -> None:
        """Ray placements: the learner's sender and one receiver per worker, joined."""
        ws = self.cfg.weight_sync
        info = self.learner.call("setup_sender", ws, 1 + len(self.workers)).result()
        setups = [w.call("setup_weight_receiver", ws, info, rank)
                  for rank, w in enumerate(self.workers, start=1)]
        self.learner.call("connect")              # collective for a broadcast: concurrent
        for f in setups:
            f.result()

    def _sync(self, step: int, initial: bool = False) -> None:
        """Queue the learner's current weights to every worker (behind the calls already
        queued on it); reports are collected by _settle_syncs."""
        self._settle_syncs(wait=True)     # a sender may reuse the last sync's buffers
        ready_at = time.time()
        if self.layout.on_ray:
            meta, ticket = self.learner.call("prepare", step, initial, num_returns=2)
            served = [w.call("receive_weights", ticket, step) for w in self.workers]
            self.learner.call("transfer", step)
        else:
            meta, tensors = self.learner.call("publish", step, num_returns=2)
            served = [w.call("load_in_place", self.version, tensors, step)
                      for w in self.workers]
        self.pending.append(PendingSync(step, ready_at, meta, served))
        self.policy.weights_sent(self.version)

    def _settle_syncs(self, wait: bool) -> None:
        """Report the syncs whose every worker has answered (all of them when ``wait``)."""
        while self.pending and (wait or all(f.done() for f in self.pending[0].served)):
            p = self.pending.pop(0)
            meta = p.meta.result()
            reports = [f.result() for f in p.served]
            fps = [s.report.fingerprint for s in reports]
            odd = next((fp for fp in fps if fp != meta.fingerprint), fps[0])
            res = SyncResult(
                transport=self.transport, version_learner=meta.version,
                version_rollout=min(s.report.version for s in reports),
                fingerprint_learner=meta.fingerprint, fingerprint_rollout=odd,
                bytes=max(s.report.bytes for s in reports),
                latency_s=max(s.at for s in reports) - p.ready_at,
                workers=tuple(s.report for s in reports))
            self._report_sync(p.step, res)

    def _report_sync(self, step: int, res: SyncResult) -> None:
        self.last_sync = res
        self.tel.emit(WeightSyncEvent(
            step=step, transport=res.transport, version_learner=res.version_learner,
            version_rollout=res.version_rollout, fingerprint_learner=res.fingerprint_learner,
            fingerprint_rollout=res.fingerprint_rollout, matched=res.matched,
            latency_s=res.latency_s, bytes=res.bytes))
        if not res.matched:
            self.tel.log(f"weight sync v{res.version_learner} did not apply: rollout serves "
                         f"v{res.version_rollout} fingerprint {res.fingerprint_rollout}, "
                         f"learner sent {res.fingerprint_learner}", level="error")

    def _drain_spans(self) -> None:
        futures = [h.call("drain_spans") for h in [self.learner, *self.workers]]
        for f in futures:
            self.tel.ingest(*f.result())

    def _eval(self, step: int) -> dict[str, float]:
        t = self.cfg.telemetry.eval_temperature
        temp = self.cfg.rollout.temperature if t is None else t
        values = self.workers[0].call("evaluate", temp, step_seed(self.cfg.model.seed, -1),
                                      self.cfg.telemetry.eval_samples).result()
        self.tel.emit(MetricsEvent(step=step, values=values))
        return values

    def _checkpoint(self) -> None:
        path, step, version, fp = self.learner.call(
            "save_checkpoint", self.ckpt_root, self.cfg.checkpoint.keep_last).result()
        self.tel.emit(CheckpointEvent(step=step, version=version, path=path, fingerprint=fp))

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
        t0, version = time.time(), self.version
        # The learner's own devices wait for experience (shared ones are busy generating).
        waiting = [d for d in self.layout.learner.devices if d not in self.layout.rollout]
        with self.tel.phase("waiting", waiting, step, version):
            groups = self.policy.next_batch(step, version)
        samples: list[Sample] = [s for g in groups for s in g]
        try:
            staleness = check_staleness(samples, version)
        except StalenessError as exc:
            self.tel.emit(LogEvent(level="error", message=f"step {step}: {exc}"))
            raise
        if max(staleness) > self.policy.max_staleness:   # trained on, shown, alerted on
            self.tel.emit(LogEvent(level="error", message=(
                f"step {step}: staleness {max(staleness)} exceeds the bound "
                f"{self.policy.max_staleness} of async_policy {self.cfg.async_policy.type!r}")))
        rewards = torch.tensor([s.reward for s in samples])
        adv = group_advantages(rewards, self.cfg.algorithm.group_size,
                               self.cfg.algorithm.normalize_std)
        for s, a in zip(samples, adv.tolist(), strict=True):
            s.advantage = a
        for w in self.sharing:            # colocated: the engine yields the device
            w.call("sleep")
        m = self.learner.call("update", samples, step).result()
        for w in self.sharing:
            w.call("wake_up")
        self.step, self.version = self.learner.call("state").result()
        self._drain_spans()           # the phases so far reach the control plane before a
        self._sync(step)              # sync that may hang (PhaseHang names what follows)
        self._settle_syncs(wait=not self.policy.overlaps)
        self._drain_spans()
        t1 = time.time()
        m.update(self.tel.step_metrics(t0, t1))
        m.update(reward_metrics([w.call("reward_metrics").result() for w in self.workers], m))
        lengths = [len(s.response_ids) for s in samples]
        tokens = sum(lengths)
        res = self.last_sync
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
            "throughput/samples_per_s": len(samples) / m["time/step_s"],
            "rollout/tokens_per_s": tokens / max(m["time/rollout_s"], 1e-9),
            "staleness/mean": statistics.fmean(staleness),
            "staleness/max": float(max(staleness)),
            "buffer/dropped_stale": float(self.buffer.dropped_stale),
            "buffer/recycled": float(self.experience.recycled),
            "samples/mixed_versions": float(sum(s.mixes_versions for s in samples)),
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
            eval_before = self._eval(self.step)
            rl_start = time.time()
            while self.step < total:
                step = self.step
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
            self.policy.close()
            self._settle_syncs(wait=True)
            self._drain_spans()               # what ran after the last step's metrics
            eval_after = self._eval(self.step)
            self._checkpoint()
            status = "stopped" if self._stop_requested() else "succeeded"
        except KeyboardInterrupt:
            status = "stopped"
            raise
        except Exception as exc:
            self.tel.emit(LogEvent(level="error", message=f"{type(exc).__name__}: {exc}"))
            raise
        finally:
            self._teardown()
            self.status(status)
            self.tel.sink.close()
            if prev is not None:
                signal.signal(signal.SIGTERM, prev)
        return RunSummary(status=status, steps_done=self.step,
                          eval_before=eval_before,
                          eval_after=eval_after, last_metrics=last, out_dir=str(self.out_dir),
                          wall_s=time.time() - start)


def last_seq(path: Path) -> int:
    """The highest seq in an events.jsonl (0 when there is none)."""
    if not path.exists():
        return 0
    return max((e.seq for e in read_jsonl(path)), default=0)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _drop_bound(cfg: RunConfig) -> int | None:
    """Staleness beyond which the buffer drops groups: the policies that may outrun it."""
    p = cfg.async_policy
    if isinstance(p, FullyAsyncPolicyConfig | PartialRolloutPolicyConfig):
        return p.max_staleness
    return None
