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

from engine.weightsync.base import Ticket, load_checked
from engine.weightsync.layout import FlatLayout, as_bytes, dtype_of


class ObjectStoreSender:
    name = "object_store"

    def __init__(self, cfg, world_size: int):
        self._ref = None

    def join_info(self) -> None:
        return None

    def connect(self) -> None:
        pass

    def prepare(self, named_tensors: Sequence[tuple[str, torch.Tensor]], version: int,
                initial: bool = False) -> Ticket:
        layout = FlatLayout.of(named_tensors)
        self._ref = ray.put([as_bytes(t).cpu().numpy() for _, t in named_tensors])
        return Ticket(self.name, version, initial, layout, self._ref)

    def transfer(self) -> None:
        pass

    def close(self) -> None:
        self._ref = None


class ObjectStoreReceiver:
    def __init__(self, cfg, join_info: object, rank: int):
        pass

    def receive(self, ticket: Ticket, engine):
        parts = ray.get(ticket.payload)         # read-only views into the object store
        with warnings.catch_warnings():         # torch warns on read-only arrays; we only read
            warnings.simplefilter("ignore", UserWarning)
            named = [(s.name, torch.from_numpy(p).view(dtype_of(s.dtype)).reshape(s.shape))
                     for s, p in zip(ticket.layout.specs, parts, strict=True)]
        return load_checked(engine, ticket, named)

    def close(self) -> None:
        pass
