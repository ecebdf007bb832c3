"""Shared-memory transport: one flat buffer in a tmpfs file, mapped by both sides.

    learner                                   rollout worker (same node)
    prepare: copy each tensor to its slot     flat = torch.from_file(path, shared=True)
             (copy 1: learner -> shm)         engine.load_weights(layout.views(flat))
    ticket = (version, layout, path)  ----->  (copy 2: shm -> engine), fingerprint

Each side maps the file once and keeps the mapping while the layout stays the same, so a
sync costs two memcpys of the weights plus the receiver's fingerprint; the pages are
touched once, on the first sync. The learner unlinks the file on close (a worker's mapping
stays valid until it maps the next one). A learner that was killed cannot: its file is
named rlplane-weights-<host>-<pid>-*, and the next sender on that host removes the files
of processes that no longer exist.

    sender.adopt(policy.named_parameters())   # once: parameters now live in the buffer

After ``adopt`` the optimizer writes straight into shared memory and ``prepare`` copies
only tensors that are not already in their slot, so a sync is one memcpy (the worker's).
The learner must then not step while a sync is in flight (push_to_workers blocks).
"""

from __future__ import annotations

import os
import socket
import tempfile
import weakref
from collections.abc import Sequence

import torch

from engine.weightsync.base import SenderDefaults, Ticket, TransportUnavailable, load_checked
from engine.weightsync.layout import FlatLayout


def _unlink(path: str) -> None:
    if os.path.exists(path):
        os.unlink(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:              # someone else's process: alive
        return True
    return True


def remove_orphans(directory: str) -> list[str]:
    """Unlink the buffers this host's dead learners left in ``directory``."""
    prefix = f"rlplane-weights-{socket.gethostname()}-"
    removed = []
    for name in os.listdir(directory):
        pid = name[len(prefix):].split("-", 1)[0]
        if name.startswith(prefix) and pid.isdigit() and not _alive(int(pid)):
            path = os.path.join(directory, name)
            try:
                os.unlink(path)
                removed.append(path)
            except FileNotFoundError:
                pass
    return removed


def map_file(path: str, nbytes: int) -> torch.Tensor:
    """A uint8 tensor over the file's bytes, shared with every other process mapping it."""
    return torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)


class ShmSender(SenderDefaults):
    name = "shm"

    def __init__(self, cfg, world_size: int):
        self.directory = cfg.directory
        self.layout: FlatLayout | None = None
        self.path: str | None = None
        self._flat: torch.Tensor | None = None
        self._finalizer = None

    def _allocate(self, layout: FlatLayout) -> None:
        self.close()
        remove_orphans(self.directory)
        st = os.statvfs(self.directory)
        if st.f_bavail * st.f_frsize < layout.nbytes:     # else a write past it is SIGBUS
            raise TransportUnavailable(
                f"weight_sync.directory = {self.directory!r} has "
                f"{st.f_bavail * st.f_frsize / 1e6:.0f} MB free and the weights need "
                f"{layout.nbytes / 1e6:.0f} MB; point weight_sync.directory at a larger "
                f"tmpfs (a container's /dev/shm is 64 MB unless it runs with --shm-size)")
        fd, path = tempfile.mkstemp(
            prefix=f"rlplane-weights-{socket.gethostname()}-{os.getpid()}-", dir=self.directory)
        try:
            os.ftruncate(fd, layout.nbytes)
        finally:
            os.close(fd)
        self._finalizer = weakref.finalize(self, _unlink, path)
        self.layout, self.path, self._flat = layout, path, map_file(path, layout.nbytes)

    def adopt(self, named_parameters) -> None:
        """Move these tensors (nn.Parameters, or any tensors) into the shared buffer: each
        one's ``.data`` becomes its slot, so syncing them later copies nothing here."""
        named = list(named_parameters)
        self._allocate(FlatLayout.of(named))
        with torch.no_grad():
            for (_, t), (_, slot) in zip(named, self.layout.views(self._flat), strict=True):
                slot.copy_(t)
                t.data = slot

    def prepare(self, named_tensors: Sequence[tuple[str, torch.Tensor]], version: int,
                initial: bool = False) -> Ticket:
        layout = FlatLayout.of(named_tensors)
        if layout != self.layout:
            self._allocate(layout)
        with torch.no_grad():
            for (_, t), (_, slot) in zip(named_tensors, layout.views(self._flat), strict=True):
                if t.data_ptr() != slot.data_ptr():          # adopted tensors already are
                    slot.copy_(t)
        return Ticket(self.name, version, initial, layout, self.path)

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
