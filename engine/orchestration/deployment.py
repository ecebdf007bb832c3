"""Where a run's actors live, from start to teardown: one context manager.

    with deploy(cfg, layout, policy_dir, model_dir, checkpoint, log) as d:
        d.learner, d.workers        # actor handles (engine.orchestration.actors)
        d.critic                    # PPO's critic on its own bundle, or None (in the learner)
        d.sharing                   # rollout workers on the learner's devices (colocated)
        d.sync                      # the connected WeightSyncSession
        d.each(Telemetered.drain_spans)          # one call on every actor, results in order
        d.each(RolloutWorker.drain_logs, actors=d.workers)         # ... or on some of them
        d.each(Telemetered.drain_spans, lost=([], []), answer_s=60)   # a rollout worker
                                    # dead, or silent for 60 s: noted in d.lost, ([], [])
        d.update(samples, step, version)         # colocated engines asleep meanwhile; a
        d.save_checkpoint(root, keep, step, files)   # critic on its own bundle takes part
        d.replace_worker(i, step)                # on Ray: a new rollout worker in place i,
                                                 # synced (engine.orchestration.replacement)
        d.add_worker(step); d.retire_worker()    # on Ray: one more rollout worker, synced,
                                                 # on a place of its own; the last one out
                                                 # (engine.orchestration.resizing)
    # gone: transports closed, actors killed, placement group removed, Ray shut down
    # (only when this run started it)

Colocated with ``ray = false`` (the default) the learner and one rollout worker live in
this process and weights are copied in place; with ``overlap_threads`` the worker runs on a
thread of its own with that many torch threads, so an overlapping async policy generates
the next batch while the learner updates: by default (``overlap_share = "idle"``) at the
lowest CPU priority, the learner keeping every core; "split": the learner keeps the rest.
Any other placement reserves a Ray placement group, refused up front when it cannot fit,
and starts each worker as a Ray actor on its bundle, joined by the configured two-sided
transport.
"""

from __future__ import annotations

import os
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.config import InPlaceSyncConfig, RunConfig
from engine.experience import Sample
from engine.faults import for_replacement
from engine.orchestration.actors import ActorLost, LocalActor, RayActor, ThreadActor
from engine.orchestration.placement import Layout, Place, RolloutPlaces, reserve
from engine.orchestration.workers import (
    CriticWorker,
    LearnerWorker,
    RolloutWorker,
    Telemetered,
)
from engine.telemetry.contention import LEARNER_ROWS, slowdowns
from engine.weightsync.base import SyncResult
from engine.weightsync.session import WeightSyncSession

RAISE = object()     # Deployment.each: a dead actor's error propagates
IDLE_NICE = 19       # placement.overlap_share = "idle": the rollout thread's priority


@dataclass(frozen=True)
class Deployment:
    learner: LocalActor | RayActor
    workers: list[LocalActor | RayActor]
    sharing: list[LocalActor | RayActor]
    sync: WeightSyncSession
    critic: LocalActor | RayActor | None = None
    # a place -> a new rollout worker actor on its bundle (None: not on Ray)
    start_worker: Callable[[Place], RayActor] | None = None
    places: RolloutPlaces | None = None       # the workers' places, in order (on Ray)
    # place -> (handle, cause) of rollout workers found dead, not yet replaced
    lost: dict[int, tuple[Any, str]] = field(default_factory=dict)
    # in this process, the rollout worker on a thread of its own (placement.overlap_threads)
    threaded: bool = False

    @property
    def actors(self) -> list[LocalActor | RayActor]:
        """Every actor of the run, in one order: the learner, the rollout workers, the
        critic on its own bundle if there is one."""
        return [self.learner, *self.workers, *([] if self.critic is None else [self.critic])]

    def each(self, method: Callable, *args: Any, actors: list | None = None,
             lost: Any = RAISE, answer_s: float | None = None) -> list:
        """``method`` called on every actor (or on ``actors``, such as the rollout workers)
        at once; their results, in that order. With ``lost``, a rollout worker that died
        answers that instead, and is noted for replacement (``note_lost``); with
        ``answer_s`` too, so is one that has not answered that long after the call (a
        health check, for the telemetry group's methods, which answer while a worker
        generates)."""
        calls = [(a, a.call(method, *args)) for a in (self.actors if actors is None else actors)]
        deadline = None if answer_s is None or lost is RAISE else time.monotonic() + answer_s
        out = []
        for a, f in calls:
            place = next((i for i, w in enumerate(self.workers) if w is a), None)
            wait = (None if deadline is None or place is None
                    else max(0.0, deadline - time.monotonic()))
            try:
                out.append(f.result(wait))
            except ActorLost as exc:
                if lost is RAISE or place is None:
                    raise
                self.note_lost(place, a, exc.cause)
                out.append(lost)
        return out

    def note_lost(self, index: int, handle: Any, cause: str) -> None:
        """Rollout worker ``handle`` (in place ``index`` when it was called) died, or hung:
        killed now, so that no call queued on it (a sync) waits for it."""
        if self.workers[index] is handle and index not in self.lost:
            handle.kill()
            self.lost[index] = (handle, cause)

    def replace_worker(self, index: int, step: int) -> SyncResult:
        """A new rollout worker in place ``index``, on the old one's bundle (killed first:
        a hung one must go, and a dead one frees its bundle), serving the learner's
        current weights before anything else is asked of it; returns that sync."""
        if self.start_worker is None:
            raise RuntimeError("a rollout worker in the driver's process cannot be replaced")
        old = self.workers[index]
        self.lost.pop(index, None)
        old.kill()
        new = self.start_worker(self.places.used[index])
        self.workers[index] = new
        self.sharing[:] = [new if h is old else h for h in self.sharing]
        return self.sync.rejoin(index, new, step)

    def add_worker(self, step: int) -> SyncResult:
        """One more rollout worker, last, on a place of its own (RolloutPlaces.take),
        serving the learner's current weights before anything else is asked of it; returns
        that sync. When it cannot be placed (PlacementError) or dies first (ActorLost),
        nothing was added: its place is given back and the error propagates."""
        if self.start_worker is None:
            raise RuntimeError("a rollout worker in the driver's process cannot be added")
        place = self.places.take()
        new = None
        try:
            new = self.start_worker(place)
            res = self.sync.join(new, step)
        except BaseException:
            if new is not None:
                new.kill()
            self.places.give_back()
            raise
        self.workers.append(new)
        return res

    def retire_worker(self, close_s: float = 30.0) -> list:
        """The last rollout worker leaves (its work in flight done: the policy's
        ``retire``): out of the weight sync, its transport end and reward closed (within
        ``close_s``), its actor killed, its place given back. Returns the spans it closed
        since the loop last drained them (none, if it died), which would go with it."""
        index = len(self.workers) - 1
        handle = self.workers[index]
        self.sync.leave(index)
        self.workers.pop()
        self.lost.pop(index, None)          # a loss seen while it left: not to replace
        self.sharing[:] = [h for h in self.sharing if h is not handle]
        spans = []
        try:
            spans, _ = handle.call(Telemetered.drain_spans).result(close_s)
            handle.call(RolloutWorker.close).result(close_s)
        except ActorLost:
            pass                            # dead or wedged: the kill ends it either way
        handle.kill()
        self.places.give_back()
        return spans

    def corun_slowdown(self, weight_bytes: int, rows: int, seconds: float = 0.1,
                       rounds: int = 3) -> dict[str, float]:
        """How much the learner and the rollout workers slow one another computing at
        once, {"learner": x, "rollout": y} (engine.telemetry.contention; ``rows``: a
        worker's rows per generate call), the median of ``rounds`` rounds: probed where
        they can overlap (on Ray, or the worker on a thread of its own); {} where nothing
        runs beside anything, or on CUDA devices."""
        if (self.start_worker is None and not self.threaded) or not self.workers:
            return {}
        probe = Telemetered.corun_probe
        learner_args = (LEARNER_ROWS, weight_bytes, seconds)
        rollout_args = (rows, weight_bytes, seconds)
        measured: list[dict[str, float]] = []
        for _ in range(rounds):
            alone = {"learner": self.learner.call(probe, *learner_args).result(),
                     "rollout": self.workers[0].call(probe, *rollout_args).result()}
            # the workers' calls first: a learner in this process runs its call when made
            rollout = [w.call(probe, *rollout_args) for w in self.workers]
            learner = self.learner.call(probe, *learner_args)
            together = {"learner": learner.result(), "rollout": rollout[0].result()}
            for f in rollout[1:]:
                f.result()
            measured.append(slowdowns(alone, together))
        return {k: statistics.median(m[k] for m in measured) for k in measured[0]}

    def update(self, samples: list[Sample], step: int, version: int) -> dict[str, float]:
        """The learner's update of ``step``, colocated rollout engines asleep meanwhile (they
        yield the device). With a critic on its own bundle, its values give the advantages
        first, then its value update runs beside the actor's."""
        if self.threaded:
            # An in-place sync's ticket holds the learner's live tensors, which its
            # receiver (the worker's thread) copies: the update must not change them
            # meanwhile (engine.weightsync.inplace).
            self.sync.quiesce()
        for w in self.sharing:
            w.call(RolloutWorker.sleep)
        if self.critic is None:
            metrics = self.learner.call(LearnerWorker.update, samples, step).result()
        else:
            adv = self.critic.call(CriticWorker.estimate, samples, step, version)
            actor = self.learner.call(LearnerWorker.update, samples, step, adv)
            critic = self.critic.call(CriticWorker.train, step, version)
            metrics = actor.result() | critic.result()
        for w in self.sharing:
            w.call(RolloutWorker.wake_up)
        return metrics

    def save_checkpoint(self, root: Path, keep_last: int, step: int,
                        files: dict[str, str]) -> tuple[str, int, int, str]:
        """The learner's checkpoint (path, step, version, fingerprint) holding the driver's
        ``files``; a critic on its own bundle saves its state first and the learner moves
        it in."""
        critic_state = None if self.critic is None else self.critic.call(
            CriticWorker.save_state, root, step)
        return self.learner.call(LearnerWorker.save_checkpoint, root, keep_last,
                                 critic_state, files).result()


@contextmanager
def deploy(cfg: RunConfig, layout: Layout, policy_dir: Path, model_dir: Path,
           checkpoint: Path | None, log: Callable[..., None]) -> Iterator[Deployment]:
    learner_args = (cfg, policy_dir, model_dir, layout.learner.devices, checkpoint)
    started: list[tuple[LocalActor | RayActor, type]] = []
    pg, ray_started, critic, places = None, False, None, None
    overlap, restore_threads = 0, None
    try:
        if not layout.on_ray:
            overlap = getattr(cfg.placement, "overlap_threads", 0)
            idle = getattr(cfg.placement, "overlap_share", "split") == "idle"
            if overlap and not idle:
                cores = torch.get_num_threads()
                torch.set_num_threads(max(1, cores - overlap))     # the learner's share
                restore_threads = cores
            learner = LocalActor(LearnerWorker(*learner_args))
            started.append((learner, LearnerWorker))
            workers = [ThreadActor(RolloutWorker(cfg, policy_dir, model_dir, w.devices),
                                   overlap, "rollout", nice=IDLE_NICE if idle else 0)
                       if overlap else
                       LocalActor(RolloutWorker(cfg, policy_dir, model_dir, w.devices))
                       for w in layout.workers]
            started += [(w, RolloutWorker) for w in workers]
            # overlapped: the worker generates beside the update on cores of its own
            sharing, sync_cfg = [] if overlap else workers, InPlaceSyncConfig()
            if cfg.weight_sync.type != "in_place":
                log(f'weight_sync.type = "{cfg.weight_sync.type}" is not used: this '
                    f"placement keeps the rollout engine in the learner's process, so "
                    f"weights are copied in place (placement.ray = true uses it)",
                    level="warning")
        else:
            import ray

            if not ray.is_initialized():
                # The job's cluster (RAY_ADDRESS), else a private local one: a bare
                # ray.init() would follow a stale /tmp/ray/ray_current_cluster.
                ray.init(address=os.environ.get("RAY_ADDRESS", "local"))
                ray_started = True
            pg = reserve(layout, cfg.placement.ready_timeout_s)
            threads = cfg.placement.threads_per_actor
            log(f"placed on Ray: {len(layout.workers)} rollout worker(s) + learner"
                f"{' + critic' if layout.critic else ''} in "
                f"bundles {layout.bundles} ({layout.strategy}), {threads} torch thread(s) "
                f"per actor")
            ranks = start_learner_ranks(layout, learner_args, threads, pg)
            started += [(r, LearnerWorker) for r in ranks]
            learner = ranks[0]
            if layout.critic is not None:
                critic = RayActor.start(CriticWorker, (*learner_args[:3], layout.critic.devices,
                                                       checkpoint, threads),
                                        layout.critic.gpus, pg, layout.critic.bundle)
                started.append((critic, CriticWorker))
            spared = for_replacement(cfg)       # a replacement runs without the kill fault

            places = RolloutPlaces(layout, pg, cfg.placement.ready_timeout_s)

            def start_worker(place: Place, worker_cfg: RunConfig = spared) -> RayActor:
                w = place.slot
                h = RayActor.start(RolloutWorker, (worker_cfg, policy_dir, model_dir,
                                                   w.devices, threads), w.gpus, place.pg,
                                   w.bundle)
                started.append((h, RolloutWorker))
                return h

            workers = [start_worker(p, cfg) for p in places.used]
            sharing = [h for h, w in zip(workers, layout.workers, strict=True)
                       if set(w.devices) & set(layout.learner.devices)]
            sync_cfg = cfg.weight_sync
        d = Deployment(learner, workers, sharing, WeightSyncSession(learner, workers, sync_cfg),
                       critic, start_worker if layout.on_ray else None, places,
                       threaded=not layout.on_ray and bool(overlap))
        if layout.on_ray:
            d.sync.on_lost = d.note_lost
        for lines in d.each(RolloutWorker.drain_logs, actors=workers):
            for level, line in lines:         # what their parts said (a reward model's fit)
                log(line, level=level)
        d.sync.connect()
        yield d
    finally:
        _teardown(started, layout.on_ray, pg, ray_started, places)
        if restore_threads is not None:
            torch.set_num_threads(restore_threads)


def start_learner_ranks(layout: Layout, learner_args: tuple, threads: int,
                        pg) -> list[RayActor]:
    """The learner's actors on its bundle: one, or one per device of a sharded learner,
    which meet at a rendezvous file on their node; rank 0 gets the others' handles."""
    n, slot = layout.learner_ranks, layout.learner
    if n == 1:
        return [RayActor.start(LearnerWorker, (*learner_args, threads), slot.gpus, pg,
                               slot.bundle)]
    cfg, policy_dir, model_dir, _, checkpoint = learner_args
    rendezvous = f"file:///tmp/rlplane-fsdp-{uuid.uuid4().hex}"
    ranks = [RayActor.start(LearnerWorker, (cfg, policy_dir, model_dir, [slot.devices[r]],
                                            checkpoint, threads, r, n, rendezvous),
                            slot.gpus / n, pg, slot.bundle) for r in range(n)]
    ranks[0].call(LearnerWorker.attach_peers, ranks[1:]).result()
    return ranks


def _teardown(started: list, on_ray: bool, pg, ray_started: bool,
              places: RolloutPlaces | None) -> None:
    # Transports release what they hold (shared-memory files, process groups), reward
    # pools stop their actors; on Ray bounded, so a wedged actor cannot keep a run alive.
    closing = [h.call(cls.close) for h, cls in started]
    if on_ray:
        import ray

        if closing:
            ray.wait([f.ref for f in closing], num_returns=len(closing), timeout=30)
        for h, _ in started:
            h.kill()
        if pg is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(pg)
        if places is not None:
            places.close()
        if ray_started:
            ray.shutdown()
