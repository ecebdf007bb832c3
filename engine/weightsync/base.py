"""The weight-sync seam: learner -> rollout engine, versioned and verified.

Transports differ in how bytes move (in place, shared memory, Ray object store,
torch.distributed broadcast, checkpoint file, CUDA IPC, vLLM's own API); every one is
two-sided (WeightSender / WeightReceiver below) and ends with the receiver reporting
(version, fingerprint) of what its engine now serves. engine/weightsync/session.py drives
them and turns the reports into a SyncResult:

    result.matched   # every rollout engine's own fingerprint of what it serves == learner's
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from engine.events import WeightSyncEvent
from engine.weightsync.delta import DeltaFrame
from engine.weightsync.layout import FlatLayout


@dataclass(frozen=True)
class SyncResult:
    transport: str
    step: int                     # the step whose end the sync belongs to
    version_learner: int
    version_rollout: int          # the lowest version any rollout worker reports serving
    fingerprint_learner: str
    fingerprint_rollout: str      # the first worker's that differs from the learner's, if any
    bytes: int                    # size of the weights (each worker receives all of them)
    latency_s: float      # learner's new version -> every rollout worker reports serving it
    verify_latency_s: float = 0.0  # ... -> both ends' fingerprints are in (the sync's end)
    workers: tuple = ()   # one rollout.base.WeightReport per worker (two-sided transports)
    verified: bool = True  # False: verify_every skipped the fingerprints (both are "")
    wire_bytes: int = 0   # bytes each worker received (a delta's compressed XOR; else bytes)
    delta: DeltaFrame | None = None   # weight_sync.delta: what travelled

    @property
    def matched(self) -> bool:
        """Every worker serves the learner's version and, when verified, its fingerprint
        (an unverified sync's fingerprints are both "", so versions alone decide)."""
        return (self.fingerprint_learner == self.fingerprint_rollout
                and self.version_learner == self.version_rollout
                and all(r.fingerprint == self.fingerprint_learner
                        and r.version == self.version_learner for r in self.workers))

    @property
    def changed_frac(self) -> float | None:
        """Share of elements whose bytes changed since the last version (delta sends)."""
        d = self.delta
        return d.changed / d.elements if d is not None and d.base is not None else None

    @property
    def gb_per_s(self) -> float:
        """Gigabytes (1e9 bytes, not bits) of weights per second of resync latency."""
        return self.bytes / 1e9 / max(self.latency_s, 1e-9)

    def event(self) -> WeightSyncEvent:
        return WeightSyncEvent(
            step=self.step, transport=self.transport, version_learner=self.version_learner,
            version_rollout=self.version_rollout, fingerprint_learner=self.fingerprint_learner,
            fingerprint_rollout=self.fingerprint_rollout, matched=self.matched,
            latency_s=self.latency_s, bytes=self.bytes, verified=self.verified,
            wire_bytes=self.wire_bytes or self.bytes)

    def mismatch(self) -> str:
        """What the run's log says when the sync did not apply ("" when it did)."""
        if self.matched:
            return ""
        if not self.verified:
            return (f"weight sync v{self.version_learner} (unverified) did not apply: "
                    f"rollout serves v{self.version_rollout}")
        return (f"weight sync v{self.version_learner} did not apply: rollout serves "
                f"v{self.version_rollout} fingerprint {self.fingerprint_rollout}, learner "
                f"sent {self.fingerprint_learner}")


# --------------------------------------------------------------------------- two-sided

class StaleVersionError(ValueError):
    """A receiver was offered a version that is not newer than the one its engine serves."""


class TransportUnavailable(RuntimeError):
    """The configured transport cannot run here (e.g. CUDA IPC without CUDA)."""


@dataclass(frozen=True)
class Ticket:
    """What a sender hands each receiver for one sync: small and picklable. ``payload`` is
    the transport's own (a file path, ObjectRefs, IPC handles; None for a broadcast)."""
    transport: str
    version: int
    initial: bool                 # the first sync of a run may repeat the served version
    layout: FlatLayout
    payload: Any = None
    verify: bool = True           # both ends fingerprint (weight_sync.verify_every)
    delta: DeltaFrame | None = None   # weight_sync.delta: what travelled (XOR or full)

    @property
    def wire_bytes(self) -> int:
        """Bytes each worker receives: the compressed XOR of a delta, else the weights."""
        return self.delta.wire_bytes if self.delta is not None else self.layout.payload_bytes


def check_version(ticket: Ticket, served: int) -> None:
    """Refuse a version that does not move the engine forward (a stale or replayed sync)."""
    if ticket.initial or ticket.version > served:
        return
    raise StaleVersionError(
        f"{ticket.transport} sync offered version {ticket.version} but the engine already "
        f"serves version {served}; versions must strictly increase (initial=True only for "
        f"a run's first sync)")


class WeightSender(Protocol):
    """Learner side of a transport. Setup once, then one sync at a time (the next
    ``prepare`` may reuse the buffers of the last one):

        sender = build_sender(cfg.weight_sync, world_size=1 + len(workers))
        info   = sender.join_info()            # picklable; None unless collective
        (each worker: build_receiver(cfg.weight_sync, info, rank))
        sender.connect()                       # concurrently with the workers' setup
        ticket  = sender.prepare(named_tensors, version)     # learner process
        (each worker: receiver.receive(ticket, engine) -> WeightReport)
        sender.transfer()          # the sender's blocking part (a broadcast's collective)

    WeightSyncSession (session.py) is exactly this sequence, across actors.
    """

    name: str

    def join_info(self) -> object: ...

    def connect(self) -> None: ...

    def prepare(self, named_tensors: Sequence[tuple[str, torch.Tensor]], version: int,
                initial: bool = False) -> Ticket: ...

    def transfer(self) -> None: ...

    def close(self) -> None: ...


class SenderDefaults:
    """For senders without a rendezvous whose bytes are in place when prepare returns."""

    def join_info(self) -> None:
        return None

    def connect(self) -> None:
        pass

    def transfer(self) -> None:
        pass

    def close(self) -> None:
        pass


class ReceiverDefaults:
    """For receivers that need neither setup nor teardown."""

    def __init__(self, cfg, join_info: object, rank: int):
        pass

    def close(self) -> None:
        pass


class WeightReceiver(Protocol):
    """Rollout-worker side: turns a ticket into tensors, refuses a stale version
    (check_version), loads them into the engine and returns the engine's own report
    (version + fingerprint recomputed from what it serves)."""

    def receive(self, ticket: Ticket, engine) -> object: ...   # -> rollout.base.WeightReport

    def close(self) -> None: ...


def load_checked(engine, ticket: Ticket, named_tensors) -> object:
    """The receivers' common last step: refuse a stale version, then let the engine load
    the tensors and fingerprint what it serves (never an echo of what was sent; an
    unverified sync, ticket.verify False, skips the fingerprint)."""
    check_version(ticket, engine.weight_version())
    return engine.load_weights(named_tensors, ticket.version, verify=ticket.verify)
