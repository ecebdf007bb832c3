"""The RL loop: builds a run's parts from its RunConfig and drives them step by step.

    warm start (cached) -> deploy: learner + rollout workers (engine.orchestration.deployment)
    weight sync (version N) -> preflight -> eval (held-out)
    for step:
        live controls (engine.orchestration.live_controls): apply, or hold while paused
                            (set_rollout_workers: engine.orchestration.resizing)
        groups  = policy.next_batch(step, version)  rollout + reward on the workers [spans]
                                                    (dynamic sampling: no flat groups); the
                                                    problems from the run's data stream,
                                                    each served, trained or dropped in its
                                                    ledger (engine.orchestration.ledger)
        check staleness <= the policy's bound       (negative: error event, run fails)
        adv     = GRPO's advantages                 (engine.learner.advantages; PPO's come
                                                    from its critic: Deployment.update)
        metrics = d.update(samples)                 version += 1   [spans: critic, learner]
        sync.send(step) -> every rollout worker     each reports (version, fp)     [spans]
        emit metrics.append (engine.telemetry.step_metrics; every actor's spans and
                             the device/* its DeviceSampler measured; data/* the ledger's)
        emit samples        (telemetry.sample_groups groups, with the learner's
                             per-token logprobs: engine.telemetry.samples)
        a rollout worker found dead (a generation call, a sync, a telemetry call):
                            replaced once the learner's version is the one sent, the
                            prompts it held dropped (engine.orchestration.replacement)
    eval -> final checkpoint -> run.status
    (each checkpoint: the learner's, holding data.json, the data position and ledger that
    a resumed run's stream continues: each training prompt once an epoch across resumes)

RunLoop is the run from its first status to its last; StepLoop, made once the run is
deployed, the steps on that deployment. Every policy runs on every placement; only on Ray
do generation and training overlap. A SIGTERM, a STOP file in the run directory or a
``stop_requested()`` callback answering True makes it checkpoint after the step in
progress and end "stopped".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from engine import metrics as M
from engine.config import RunConfig, dump_config
from engine.controls import Control
from engine.events import (
    CheckpointEvent,
    EventSink,
    LogEvent,
    MetricsEvent,
    RunStatusEvent,
    RunSummary,
)
from engine.experience import (
    ExperienceBuffer,
    Sample,
    StalenessError,
    check_staleness,
    over_bound,
)
from engine.faults import skipped_on_resume, wrap_buffer
from engine.learner.advantages import assign_advantages
from engine.learner.checkpoint import latest_checkpoint
from engine.learner.warmstart import ensure_warm_start
from engine.model import load_tokenizer
from engine.orchestration.actors import ActorLost
from engine.orchestration.deployment import Deployment, deploy
from engine.orchestration.ledger import checkpoint_files, resume_stream
from engine.orchestration.live_controls import LiveControls, StopSignal
from engine.orchestration.placement import layout_for
from engine.orchestration.policies import Experience, buffer_bound, build_policy
from engine.orchestration.replacement import Replacements
from engine.orchestration.resizing import Resizing
from engine.orchestration.workers import LearnerWorker, RolloutWorker, Telemetered
from engine.reward import reward_metrics
from engine.rollout.preflight import preflight_verdict
from engine.seeds import seed_everything, step_seed
from engine.tasks import task_for
from engine.telemetry.contention import weight_bytes
from engine.telemetry.export import ExportSink
from engine.telemetry.recorder import Telemetry
from engine.telemetry.samples import inspected_rows, samples_event
from engine.telemetry.sinks import FanoutSink, JsonlSink, last_seq
from engine.telemetry.step_metrics import (
    env_metrics,
    group_length_metrics,
    group_metrics,
    sample_metrics,
    sync_metrics,
    throughput_metrics,
)
from engine.weightsync.base import SyncResult


class RunLoop:
    """One run: its telemetry, stop signal and live controls, which exist before it starts
    (an operator may steer it from its first step); run() takes it to its end status."""

    def __init__(self, cfg: RunConfig, out_dir: Path, sink: EventSink | None = None,
                 progress=None, stop_requested: Callable[[], bool] | None = None,
                 take_controls: Callable[[], list[Control]] | None = None):
        self.cfg, self.out_dir, self.progress = cfg, Path(out_dir), progress
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.layout = layout_for(cfg.placement)
        jsonl = JsonlSink(self.out_dir / "events.jsonl") if cfg.telemetry.jsonl else None
        export = (ExportSink(cfg.telemetry.export, self.out_dir, cfg.name)
                  if cfg.telemetry.export else None)
        self.tel = Telemetry(FanoutSink(jsonl, export, sink), self.layout.devices)
        self.ckpt_root = self.out_dir / "checkpoints"
        self.stop = StopSignal(self.out_dir / "STOP", stop_requested)
        self.controls = LiveControls(take_controls, cfg.telemetry.eval_every_steps, self.tel,
                                     self.stop)

    def run(self, steps: int | None = None, resume: bool = False) -> RunSummary:
        with self.stop.on_sigterm():
            return self._run(self.cfg.steps if steps is None else steps, resume)

    def _run(self, total: int, resume: bool) -> RunSummary:
        cfg, start = self.cfg, time.time()
        if resume:
            # A resumed run is the same run to its consumers, which dedup by seq: continue
            # the sequence instead of restarting it (or every new event reads as a replay).
            self.tel.seq = last_seq(self.out_dir / "events.jsonl")
        self.status("starting")
        status, last, eval_before, eval_after = "failed", {}, {}, {}
        reason = "failed before its first step"
        try:
            seed_everything(cfg.model.seed)
            (self.out_dir / "config.toml").write_text(dump_config(cfg))
            self.status("warm_start")
            model_dir = ensure_warm_start(cfg, log=self.tel.log)
            ckpt = latest_checkpoint(self.ckpt_root) if resume else None
            policy_dir = ckpt or model_dir
            with deploy(cfg, self.layout, policy_dir, model_dir, ckpt, self.tel.log) as d:
                loop = StepLoop(self, d, policy_dir, ckpt)
                self.status("running")
                eval_before = loop.evaluate(loop.step)
                last = loop.steps(total)
                eval_after = loop.finish()
            status = "stopped" if self.stop.requested() else "succeeded"
            reason = loop.ended_by
        except KeyboardInterrupt:
            status, reason = "stopped", "interrupted (KeyboardInterrupt)"
            raise
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            self.tel.emit(LogEvent(level="error", message=reason))
            raise
        finally:
            self.status(status, reason)
            self.tel.sink.close()
        return RunSummary(status=status, steps_done=loop.step, eval_before=eval_before,
                          eval_after=eval_after, last_metrics=last,
                          out_dir=str(self.out_dir), wall_s=time.time() - start)

    def status(self, status: str, message: str = "") -> None:
        self.tel.emit(RunStatusEvent(status=status, message=message))


class StepLoop:
    """The steps on one deployment, from the learner's state (a resumed run's) on: the
    policy, the first sync (every worker serves version N), the logprob preflight."""

    def __init__(self, run: RunLoop, d: Deployment, policy_dir: Path, ckpt: Path | None):
        cfg = self.cfg = run.cfg
        self.tel, self.layout, self.ckpt_root = run.tel, run.layout, run.ckpt_root
        self.controls, self.stop, self.progress = run.controls, run.stop, run.progress
        self.d = d
        self.step, self.version = d.learner.call(LearnerWorker.state).result()
        if ckpt is not None:
            self.tel.log(f"resumed from {ckpt.name} (step {self.step}, version "
                         f"{self.version})")
        self.buffer = wrap_buffer(ExperienceBuffer(buffer_bound(cfg.async_policy)),
                                  cfg.faults, lambda: self.step)
        self.tokenizer = load_tokenizer(policy_dir, cfg.model.trust_remote_code)
        task = task_for(cfg, self.tokenizer, log=self.tel.log)
        data = resume_stream(task, cfg.rollout.prompts_per_step, ckpt,
                             skipped_on_resume(cfg.faults), log=self.tel.log)
        self.experience = Experience(d.workers, task, self.buffer,
                                     cfg.rollout.prompts_per_step, cfg.algorithm.group_size,
                                     cfg.model.seed, resumed_at=self.step,
                                     algorithm=cfg.algorithm,
                                     max_new_tokens=cfg.rollout.max_new_tokens, data=data)
        self.ledger = data.ledger
        # A replacement receives the learner's current weights: it runs where they are the
        # weights last sent (a generation call, after a sync), never between an update and
        # its sync (the next sync would offer the new worker the version it holds).
        self.replacements = Replacements(d, self.tel, cfg.placement.max_worker_replacements)
        self.experience.on_lost = self.replacements.replace
        self.policy = build_policy(cfg.async_policy, self.experience, self.version)
        self.resizing = Resizing(d, self.policy, self.tel, cfg)
        self.last_sync: SyncResult | None = None
        self.ended_by = ""                      # why steps() returned: the final status's reason
        self._logged: set[str] = set()          # worker log lines already logged
        self._send(self.step, initial=True)
        self._settle(wait=True)
        res = d.workers[0].call(RolloutWorker.preflight, policy_dir, cfg.model.seed).result()
        message, level = preflight_verdict(res, cfg.rollout)
        if message:
            self.tel.log(message, level=level)
        # reported with every step: the planner reads it from the steps it fits on
        rows = -(-cfg.rollout.prompts_per_step * cfg.algorithm.group_size // len(d.workers))
        slow = d.corun_slowdown(weight_bytes(policy_dir), rows, cfg.telemetry.corun_probe_s) \
            if cfg.telemetry.corun_probe_s > 0 else {}
        self.corun = {M.HOST_CORUN_SLOWDOWN.of(actor=k): v for k, v in slow.items()}
        if slow:
            self.tel.log("co-run probe: computing at once, "
                         + ", ".join(f"the {k} runs at {1 / x:.2f} of its speed alone"
                                     for k, x in slow.items())
                         + " (host/corun_slowdown/*: the planner's overlap figures use it)")

    def steps(self, total: int) -> dict[str, float]:
        """Train up to step ``total``; ``ended_by`` then says why it stopped there (the
        run's final status reason: the page and the API show it)."""
        cfg, rl_start, last = self.cfg, time.time(), {}
        self.ended_by = f"trained all {total} steps"
        while self.step < total:
            if not self.controls.at_boundary(self.step, self):
                self.ended_by = f"stopped on request while paused at step {self.step} of {total}"
                break
            step = self.step
            last = self.train_step(step)
            if self.progress:
                self.progress(step + 1, total, last)
            every = self.controls.eval_every
            if every and (step + 1) % every == 0 and step + 1 < total:
                self.evaluate(step + 1)
            if cfg.checkpoint.every_steps and (step + 1) % cfg.checkpoint.every_steps == 0:
                self.checkpoint()
            if self.stop.requested():
                self.ended_by = f"stopped on request after step {step + 1} of {total}"
                break
            if cfg.max_seconds is not None and time.time() - rl_start > cfg.max_seconds:
                self.ended_by = (f"max_seconds={cfg.max_seconds:g} reached after step "
                                 f"{step + 1} of {total}")
                self.tel.log(self.ended_by)
                break
        return last

    def finish(self) -> dict[str, float]:
        """After the last step: the held-out eval (returned) and the final checkpoint."""
        self.policy.close()
        self._settle(wait=True)
        self._drain_spans()                    # what ran after the last step's metrics
        values = self.evaluate(self.step)
        self.checkpoint()
        return values

    def train_step(self, step: int) -> dict[str, float]:
        d, t0, version = self.d, time.time(), self.version
        # The learner's and critic's own devices wait for experience (shared ones are
        # busy generating).
        waiting = [x for x in self.layout.trainers if x not in self.layout.rollout]
        with self.tel.phase("waiting", waiting, step, version):
            groups = self.policy.next_batch(step, version)
        if warning := self.experience.short_batch(step, groups):
            self.tel.log(warning, level="warning")
        samples: list[Sample] = [s for g in groups for s in g]
        try:
            staleness = check_staleness(samples, version)
        except StalenessError as exc:         # negative: a version counter went backwards
            self.tel.emit(LogEvent(level="error", message=f"step {step}: {exc}"))
            raise
        if message := over_bound(staleness, self.cfg.async_policy.staleness_bound,
                                 self.cfg.async_policy.type, step):
            self.tel.emit(LogEvent(level="error", message=message))
        assign_advantages(samples, self.cfg.algorithm)
        m = d.update(samples, step, version)
        self.step, self.version = d.learner.call(LearnerWorker.state).result()
        self._drain_spans()           # the phases so far reach the control plane before a
        self._send(step)              # sync that may hang (PhaseHang names what follows)
        if self.policy.overlaps:
            self._settle(wait=False)
        else:       # the workers serve the new version; the learner hashes what it sent
            self.d.sync.await_served()      # while the step's metrics are gathered
        self._drain_spans()
        m |= self.tel.step_metrics(t0, time.time())
        m |= reward_metrics(d.each(RolloutWorker.reward_metrics, actors=d.workers, lost={}),
                            m)
        stats = d.each(RolloutWorker.prefix_stats, actors=d.workers, lost=(0, 0))
        if fed := sum(s[1] for s in stats):
            m[M.ROLLOUT_PREFIX_HIT_FRAC] = sum(s[0] for s in stats) / fed
        m |= sample_metrics(samples, staleness) | throughput_metrics(samples, m)
        m |= group_metrics(groups, self.experience.dropped) | group_length_metrics(groups)
        if not self.policy.overlaps:
            self._settle(wait=True)
        m |= sync_metrics(self.last_sync) | env_metrics(samples,
                                                          self.experience.take_close_faults())
        m |= {k: v for values in d.each(Telemetered.sample_devices, lost={})
              for k, v in values.items()}
        m[M.BUFFER_DROPPED_STALE] = float(self.buffer.dropped_stale)
        m[M.BUFFER_RECYCLED] = float(self.experience.recycled)
        m[M.ROLLOUT_WORKERS] = float(len(d.workers))
        m |= self.corun
        m |= self.ledger.metrics()
        self.tel.emit(MetricsEvent(step=step, values=m))
        self._emit_samples(step, groups, samples, staleness)
        self._drain_logs()
        self.replacements.replace_lost(self.step)
        return m

    def _emit_samples(self, step: int, groups: list[list[Sample]], samples: list[Sample],
                      staleness: list[int]) -> None:
        """The inspector's sample of the batch just trained on (telemetry.sample_groups)."""
        rows = inspected_rows(groups, self.cfg.telemetry.sample_groups)
        if not rows:
            return
        learner = self.d.learner.call(LearnerWorker.token_logprobs, rows).result()
        tok = self.tokenizer
        self.tel.emit(samples_event(step, samples, rows, staleness, learner,
                                    lambda t: tok.decode([t])))

    def _drain_logs(self) -> None:
        """What the workers said during the step (a reward function's traceback, once per
        distinct error); several workers hitting one error log it once."""
        for lines in self.d.each(RolloutWorker.drain_logs, actors=self.d.workers, lost=[]):
            for level, line in lines:
                if line not in self._logged:
                    self._logged.add(line)
                    self.tel.log(line, level=level)

    def _send(self, step: int, initial: bool = False) -> None:
        self.d.sync.send(step, initial, hash_after_load=not initial and not self.policy.overlaps)
        self.policy.weights_sent(self.version)

    def _settle(self, wait: bool) -> None:
        for res in self.d.sync.settle(wait):
            self.last_sync = res
            self.tel.emit(res.event())
            if not res.matched:
                self.tel.log(res.mismatch(), level="error")
        self.replacements.replace_lost(self.step)

    def _drain_spans(self) -> None:
        for closed, running in self.d.each(Telemetered.drain_spans, lost=([], []),
                                           answer_s=self.cfg.placement.health_check_s):
            self.tel.ingest(closed, running)

    def evaluate(self, step: int) -> dict[str, float]:
        t = self.cfg.telemetry.eval_temperature
        temp = self.cfg.rollout.temperature if t is None else t
        args = (temp, step_seed(self.cfg.model.seed, -1), self.cfg.telemetry.eval_samples)
        worker = self.d.workers[0]
        try:
            values = worker.call(RolloutWorker.evaluate, *args).result()
        except ActorLost as exc:              # it died: its replacement evaluates
            self.d.note_lost(0, worker, exc.cause)
            self.replacements.replace_lost(self.step)
            values = self.d.workers[0].call(RolloutWorker.evaluate, *args).result()
        self.tel.emit(MetricsEvent(step=step, values=values))
        return values

    def checkpoint(self) -> None:
        # The data position and ledger go in with the weights, before the checkpoint is
        # renamed into place: one a resume can find holds them, whenever a kill lands.
        path, step, version, fp = self.d.save_checkpoint(
            self.ckpt_root, self.cfg.checkpoint.keep_last, self.step,
            checkpoint_files(self.ledger))
        self.tel.emit(CheckpointEvent(step=step, version=version, path=path, fingerprint=fp))

    def set_lr(self, lr: float) -> float:
        return self.d.learner.call(LearnerWorker.set_lr, lr).result()

    def set_rollout_workers(self, n: int) -> str:
        # A worker that died is replaced first: places and handles are then all live.
        self.replacements.replace_lost(self.step)
        return self.resizing.resize(n, self.step, self.version)
