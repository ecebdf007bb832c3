"""Shared-memory transport: one flat buffer in a tmpfs file, mapped by both sides.

    learner                                   rollout worker (same node)
    prepare: layout.pack(tensors, flat)       flat = torch.from_file(path, shared=True)
             (copy 1: learner -> shm)         engine.load_weights(layout.views(flat))
    ticket = (version, layout, path)  ----->  (copy 2: shm -> engine), fingerprint

Each side maps the file once and keeps the mapping while the layout stays the same, so a
sync costs two memcpys of the weights plus the receiver's fingerprint; the pages are
touched once, on the first sync. The learner unlinks the file on close (a worker's mapping
stays valid until it maps the next one).
"""

from __future__ import annotations

import os
import tempfile
import weakref
from collections.abc import Sequence

import torch

from engine.weightsync.base import Ticket, load_checked
from engine.weightsync.layout import FlatLayout


def _unlink(path: str) -> None:
    if os.path.exists(path):
        os.unlink(path)


def map_file(path: str, nbytes: int) -> torch.Tensor:
    """A uint8 tensor over the file's bytes, shared with every other process mapping it."""
    return torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)


class ShmSender:
    name = "shm"

    def __init__(self, cfg, world_size: int):
        self.directory = cfg.directory
        self.layout: FlatLayout | None = None
        self.path: str | None = None
        self._flat: torch.Tensor | None = None
        self._finalizer = None

    def join_info(self) -> None:
        return None

    def connect(self) -> None:
        pass

    def _allocate(self, layout: FlatLayout) -> None:
        self.close()
        fd, path = tempfile.mkstemp(prefix="rlplane-weights-", dir=self.directory)
        try:
            os.ftruncate(fd, layout.nbytes)
        finally:
            os.close(fd)
        self._finalizer = weakref.finalize(self, _unlink, path)
        self.layout, self.path, self._flat = layout, path, map_file(path, layout.nbytes)

    def prepare(self, named_tensors: Sequence[tuple[str, torch.Tensor]], version: int,
                initial: bool = False) -> Ticket:
        layout = FlatLayout.of(named_tensors)
        if layout != self.layout:
            self._allocate(layout)
        layout.pack([t for _, t in named_tensors], self._flat)
        return Ticket(self.name, version, initial, layout, self.path)

    def transfer(self) -> None:
        pass                     # the bytes are already where the workers read them

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        self.layout = self.path = self._flat = self._finalizer = None


class ShmReceiver:
    def __init__(self, cfg, join_info: object, rank: int):
        self._mapped: tuple[str, int] | None = None
        self._flat: torch.Tensor | None = None

    def receive(self, ticket: Ticket, engine):
        key = (ticket.payload, ticket.layout.nbytes)
        if key != self._mapped:
            self._flat, self._mapped = map_file(*key), key
        return load_checked(engine, ticket, ticket.layout.views(self._flat))

    def close(self) -> None:
        self._flat = self._mapped = None
