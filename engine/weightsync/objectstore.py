"""Ray object store transport: one ``ray.put`` per sync.

    learner                                   rollout worker
    prepare: ref = ray.put([bytes of t ...])  parts = ray.get(ref)   zero-copy on the
             (copy 1: into plasma)            learner's node; Ray fetches it elsewhere
    ticket = (version, layout, ref)  ------>  engine.load_weights(views) (copy 2)

Each tensor goes in as its own uint8 array (no packing copy); the sender holds the ref
until the next sync, so the object lives exactly as long as a worker may need it.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import ray
import torch

from engine.weightsync.base import ReceiverDefaults, SenderDefaults, Ticket, load_checked
from engine.weightsync.layout import FlatLayout, as_bytes, dtype_of


class ObjectStoreSender(SenderDefaults):
    name = "object_store"

    def __init__(self, cfg, world_size: int):
        self._ref = None

    def prepare(self, named_tensors: Sequence[tuple[str, torch.Tensor]], version: int,
                initial: bool = False) -> Ticket:
        layout = FlatLayout.of(named_tensors)
        self._ref = ray.put([as_bytes(t).cpu().numpy() for _, t in named_tensors])
        return Ticket(self.name, version, initial, layout, self._ref)

    def close(self) -> None:
        self._ref = None


class ObjectStoreReceiver(ReceiverDefaults):
    def receive(self, ticket: Ticket, engine):
        parts = ray.get(ticket.payload)         # read-only views into the object store
        with warnings.catch_warnings():         # torch warns on read-only arrays; we only read
            warnings.simplefilter("ignore", UserWarning)
            named = [(s.name, torch.from_numpy(p).view(dtype_of(s.dtype)).reshape(s.shape))
                     for s, p in zip(ticket.layout.specs, parts, strict=True)]
        return load_checked(engine, ticket, named)
