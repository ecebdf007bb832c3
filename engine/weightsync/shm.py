"""Shared-memory transport: one flat buffer in a tmpfs file, mapped by both sides.

    learner                                   rollout worker (same node)
    prepare: copy each tensor to its slot     flat = torch.from_file(path, shared=True)
             (copy 1: learner -> shm)         engine.load_weights(layout.views(flat))
    ticket = (version, layout, path)  ----->  (copy 2: shm -> engine, fingerprinted as
                                               it copies: load_fingerprinted)

Each side maps the file once and keeps the mapping while the layout stays the same, so a
sync costs two memcpys of the weights plus the hashing of each end's fingerprint (the
receiver's from cache, in its copy); the pages are touched once, on the first sync. The
learner unlinks the file on close (a worker's mapping stays valid until it maps the next
one). A learner that was killed cannot: it held an exclusive flock on its file, which died
with it, so the next sender on that host removes the files (rlplane-weights-<host>-<pid>-*)
whose lock it can take.

    sender.adopt(policy.named_parameters())   # once: parameters now live in the buffer

After ``adopt`` the optimizer writes straight into shared memory and ``prepare`` copies
only tensors that are not already in their slot, so a sync is one memcpy (the worker's).
The learner must then not step while a sync is in flight (push_to_workers blocks).

With weight_sync.delta the file holds | the full stream | the zstd-compressed XOR against
the version the workers serve | (engine/weightsync/delta.py). A worker that holds that
version reads only the XOR; any other (a version gap, a restarted worker) reads the full
stream of the same sync. Each worker keeps its own copy of the stream it last applied.
Adopting parameters cannot be combined with it (the encoder must see each new version).
"""

from __future__ import annotations

import fcntl
import os
import re
import socket
import tempfile
import time
import weakref
from collections.abc import Sequence

import torch

from engine.weightsync.base import (
    SenderDefaults,
    Ticket,
    TransportUnavailable,
    check_version,
    load_checked,
)
from engine.weightsync.delta import DeltaDecoder, DeltaEncoder
from engine.weightsync.layout import FlatLayout

ORPHAN_GRACE_S = 10.0     # a file younger than this may be between mkstemp and flock


def _release(fd: int, path: str) -> None:
    if os.path.exists(path):
        os.unlink(path)
    os.close(fd)                      # drops the flock


def _own_files(directory: str):
    """This host's buffer files in ``directory`` (rlplane-weights-<host>-<pid>-<suffix>)."""
    pattern = re.compile(rf"rlplane-weights-{re.escape(socket.gethostname())}-\d+-[a-z0-9_]+")
    return [os.path.join(directory, n) for n in os.listdir(directory) if pattern.fullmatch(n)]


def remove_orphans(directory: str) -> list[str]:
    """Unlink the buffers that dead learners of this host and user left in ``directory``.
    A live sender holds an exclusive flock on its file for as long as it lives (the kernel
    drops it when the process dies, whatever its pid namespace), so a file whose lock can
    be taken has no owner."""
    removed = []
    for path in _own_files(directory):
        try:
            st = os.stat(path)
            if st.st_uid != os.getuid() or time.time() - st.st_mtime < ORPHAN_GRACE_S:
                continue
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.unlink(path)
            removed.append(path)
        except OSError:               # held (a live sender), or gone meanwhile
            pass
        finally:
            os.close(fd)
    return removed


def file_bytes(layout: FlatLayout, delta: bool) -> int:
    """The buffer file's size: the stream, and with weight_sync.delta room after it for the
    compressed XOR (sent only when smaller than the weights)."""
    return 2 * layout.nbytes if delta else layout.nbytes


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
        self._delta = DeltaEncoder() if cfg.delta else None

    def _allocate(self, layout: FlatLayout) -> None:
        self.close()
        remove_orphans(self.directory)
        nbytes = file_bytes(layout, self._delta is not None)
        st = os.statvfs(self.directory)
        if st.f_bavail * st.f_frsize < nbytes:            # else a write past it is SIGBUS
            raise TransportUnavailable(
                f"weight_sync.directory = {self.directory!r} has "
                f"{st.f_bavail * st.f_frsize / 1e6:.0f} MB free and the weights need "
                f"{nbytes / 1e6:.0f} MB; point weight_sync.directory at a larger "
                f"tmpfs (a container's /dev/shm is 64 MB unless it runs with --shm-size)")
        fd, path = tempfile.mkstemp(
            prefix=f"rlplane-weights-{socket.gethostname()}-{os.getpid()}-", dir=self.directory)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)   # held while this sender lives
            os.ftruncate(fd, nbytes)
        except OSError:
            _release(fd, path)
            raise
        self._finalizer = weakref.finalize(self, _release, fd, path)
        self.layout, self.path, self._flat = layout, path, map_file(path, nbytes)

    def adopt(self, named_parameters) -> None:
        """Move these tensors (nn.Parameters, or any tensors) into the shared buffer: each
        one's ``.data`` becomes its slot, so syncing them later copies nothing here."""
        if self._delta is not None:
            raise TransportUnavailable(
                "shm adopt() puts the parameters in the shared buffer, which weight_sync."
                "delta = true overwrites with compressed XORs; set delta = false to adopt")
        named = list(named_parameters)
        self._allocate(FlatLayout.of(named))
        with torch.no_grad():
            for (_, t), (_, slot) in zip(named, self.layout.views(self._flat), strict=True):
                slot.copy_(t)
                t.data = slot

    def prepare(self, named_tensors: Sequence[tuple[str, torch.Tensor]], version: int,
                initial: bool = False, base: int | None = None) -> Ticket:
        layout = FlatLayout.of(named_tensors)
        if layout != self.layout:
            self._allocate(layout)
        if self._delta is not None:      # file: | full stream | compressed XOR |
            frame, wire = self._delta.encode(named_tensors, layout, version, base,
                                             cur=self._flat[:layout.nbytes])
            if wire is not None:
                self._flat[layout.nbytes:layout.nbytes + wire.numel()].copy_(wire)
            return Ticket(self.name, version, initial, layout, self.path, delta=frame)
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
        self._delta = DeltaDecoder() if cfg.delta else None

    def receive(self, ticket: Ticket, engine):
        layout, frame = ticket.layout, ticket.delta
        key = (ticket.payload, file_bytes(layout, frame is not None))
        if key != self._mapped:
            self._flat, self._mapped = map_file(*key), key
        flat = self._flat
        if frame is not None:
            check_version(ticket, engine.weight_version())   # before the base moves
            n = layout.nbytes
            if self._delta.holds(frame):
                self._delta.apply(frame, flat[n:n + frame.wire_bytes].numpy(), layout,
                                  ticket.version)
            else:          # a full send, or this worker is not at the base: read it all
                self._delta.take_full(flat[:n], layout, ticket.version)
            flat = self._delta.current
        return load_checked(engine, ticket, layout.views(flat))

    def close(self) -> None:
        self._flat = self._mapped = None
