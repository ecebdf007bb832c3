"""Driving a two-sided transport across Ray actors: what the orchestrator wires.

A rollout-worker actor exposes two methods (WeightReceiverHost provides them for an actor
that keeps its engine in ``self.engine``):

    setup_weight_receiver(cfg.weight_sync, join_info, rank) -> None
    receive_weights(ticket) -> WeightReport      # the engine's own version + fingerprint

and the learner process (whoever holds the sender) runs:

    sender = build_sender(cfg.weight_sync, world_size=1 + len(workers))
    connect_workers(sender, workers, cfg.weight_sync)          # once; collective setup
    result = push_to_workers(sender, workers, learner.named_tensors(), learner.version,
                             ready_at, learner.fingerprint(), initial=(first sync))
    result.matched, result.latency_s, result.gb_per_s

    learner                    rollout workers (rank 1..n)
    prepare(v) -> ticket  ---> receive_weights(ticket)     (all issued before transfer:
    transfer()  ===bytes===>     ... load_checked(engine)    a broadcast needs every rank
    ray.get(reports)      <---   WeightReport(v, fp)         in the collective at once)

Syncs are one at a time: push_to_workers returns only after every worker reported, and the
learner must not change its tensors before it returns (the broadcast reads them in
transfer()).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import ray
import torch

from engine.weightsync import build_receiver
from engine.weightsync.base import SyncResult, WeightSender
from engine.weightsync.fingerprint import fingerprint


def connect_workers(sender: WeightSender, workers: Sequence, cfg) -> None:
    """Build every worker's receiver and join them with the sender. The join is
    collective for a broadcast, so the sender connects while the workers do."""
    info = sender.join_info()
    futures = [w.setup_weight_receiver.remote(cfg, info, rank)
               for rank, w in enumerate(workers, start=1)]
    sender.connect()
    ray.get(futures)


def push_to_workers(sender: WeightSender, workers: Sequence,
                    named_tensors: Sequence[tuple[str, torch.Tensor]], version: int,
                    ready_at: float, learner_fingerprint: str | None = None,
                    initial: bool = False) -> SyncResult:
    """One versioned sync to every worker. ``ready_at`` is when the learner's new version
    existed (time.time()); the latency runs from it to the last worker's report."""
    named = list(named_tensors)
    ticket = sender.prepare(named, version, initial)
    futures = [w.receive_weights.remote(ticket) for w in workers]
    sender.transfer()
    fp = learner_fingerprint or fingerprint(named)     # overlaps the workers' loading
    reports = tuple(ray.get(futures))
    done = time.time()
    differing = [r for r in reports if r.fingerprint != fp]
    return SyncResult(
        transport=sender.name, version_learner=version,
        version_rollout=min(r.version for r in reports),
        fingerprint_learner=fp,
        fingerprint_rollout=(differing or reports)[0].fingerprint,
        bytes=ticket.layout.payload_bytes, latency_s=done - ready_at, workers=reports)


class WeightReceiverHost:
    """The two actor methods the session calls, for an actor that has ``self.engine``."""

    def setup_weight_receiver(self, cfg, join_info: object, rank: int) -> None:
        self._weight_receiver = build_receiver(cfg, join_info, rank, self.engine)

    def receive_weights(self, ticket):
        return self._weight_receiver.receive(ticket, self.engine)
