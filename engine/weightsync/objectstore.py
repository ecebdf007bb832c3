"""Ray object store transport: one ``ray.put`` per sync.

    learner                                   rollout worker
    prepare: ref = ray.put([bytes of t ...])  parts = ray.get(ref)   zero-copy on the
             (copy 1: into plasma)            learner's node; Ray fetches it elsewhere
    ticket = (version, layout, ref)  ------>  engine.load_weights(views) (copy 2)

Each tensor goes in as its own uint8 array (no packing copy); the sender holds the ref
until the next sync, so the object lives exactly as long as a worker may need it. With
weight_sync.delta the object is the zstd-compressed XOR against the version the workers
serve (engine/weightsync/delta.py) unless a version gap needs the full weights.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import ray
import torch

from engine.weightsync.base import (
    ReceiverDefaults,
    SenderDefaults,
    Ticket,
    check_version,
    load_checked,
)
from engine.weightsync.delta import DeltaDecoder, DeltaEncoder
from engine.weightsync.layout import FlatLayout, as_bytes, dtype_of


class ObjectStoreSender(SenderDefaults):
    name = "object_store"

    def __init__(self, cfg, world_size: int):
        self._ref = None
        self._delta = DeltaEncoder() if cfg.delta else None

    def prepare(self, named_tensors: Sequence[tuple[str, torch.Tensor]], version: int,
                initial: bool = False, base: int | None = None) -> Ticket:
        layout = FlatLayout.of(named_tensors)
        full = ray.put([as_bytes(t).cpu().numpy() for _, t in named_tensors])
        if self._delta is None:
            self._ref = full
            return Ticket(self.name, version, initial, layout, full)
        # both objects: a worker at the base fetches the XOR, any other the full weights
        frame, wire = self._delta.encode(named_tensors, layout, version, base)
        self._ref = (full, ray.put(wire.numpy()) if wire is not None else None)
        return Ticket(self.name, version, initial, layout, self._ref, delta=frame)

    def close(self) -> None:
        self._ref = None


class ObjectStoreReceiver(ReceiverDefaults):
    def __init__(self, cfg, join_info: object, rank: int):
        self._delta = DeltaDecoder() if cfg.delta else None

    def receive(self, ticket: Ticket, engine):
        layout, frame, full = ticket.layout, ticket.delta, ticket.payload
        if frame is not None:
            check_version(ticket, engine.weight_version())   # before the base moves
            full, xor = ticket.payload
            if self._delta.holds(frame):
                self._delta.apply(frame, ray.get(xor), layout, ticket.version)
                return load_checked(engine, ticket, layout.views(self._delta.current))
        parts = ray.get(full)                   # read-only views into the object store
        with warnings.catch_warnings():         # torch warns on read-only arrays; we only read
            warnings.simplefilter("ignore", UserWarning)
            named = [(s.name, torch.from_numpy(p).view(dtype_of(s.dtype)).reshape(s.shape))
                     for s, p in zip(layout.specs, parts, strict=True)]
        if frame is not None:                   # a full send: the new base for the next XOR
            layout.pack([t for _, t in named], self._delta.target(layout))
            self._delta.took_full(ticket.version)
        return load_checked(engine, ticket, named)
