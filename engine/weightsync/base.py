"""The weight-sync seam: learner -> rollout engine, versioned and verified.

    result = transport.push(learner.named_tensors(), version, learner_fingerprint)
    result.matched   # the rollout engine's own fingerprint of what it serves == learner's

Transports differ in how bytes move (in place, Ray object store, torch.distributed
broadcast, CUDA IPC); all of them end with the receiver reporting (version, fingerprint).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class SyncResult:
    transport: str
    version_learner: int
    version_rollout: int
    fingerprint_learner: str
    fingerprint_rollout: str
    bytes: int
    latency_s: float      # learner's new version -> every rollout worker reports serving it

    @property
    def matched(self) -> bool:
        return (self.fingerprint_learner == self.fingerprint_rollout
                and self.version_learner == self.version_rollout)


class WeightTransport(Protocol):
    name: str

    def push(self, named_tensors: Sequence[tuple[str, torch.Tensor]], version: int,
             learner_fingerprint: str, version_ready_at: float) -> SyncResult: ...


# --------------------------------------------------------------------------- two-sided

class WeightSender(Protocol):
    """Learner side of a cross-process transport (shared memory, Ray object store,
    torch.distributed broadcast, checkpoint file, CUDA IPC). One sync, driven by the
    orchestrator:

        ticket  = sender.prepare(named_tensors, version)     # learner process
        futures = [w.receive_weights.remote(ticket) for w in rollout_workers]
        sender.transfer()          # the sender's blocking part (a broadcast's collective)
        reports = ray.get(futures) # each: the worker's own (version, fingerprint) of what
                                   # its engine now serves -> WeightReport

    ``ticket`` is small and picklable (paths, ObjectRefs, layouts), never the weights
    themselves unless the transport is the object store's ObjectRef.
    """

    name: str

    def prepare(self, named_tensors: Sequence[tuple[str, torch.Tensor]],
                version: int) -> object: ...

    def transfer(self) -> None: ...

    def close(self) -> None: ...


class WeightReceiver(Protocol):
    """Rollout-worker side: turns a ticket into tensors, loads them into the engine and
    returns the engine's own report (version + fingerprint recomputed from what it serves)."""

    def receive(self, ticket: object, engine) -> object: ...   # -> rollout.base.WeightReport

    def close(self) -> None: ...
