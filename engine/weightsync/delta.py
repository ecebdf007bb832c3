"""Delta weight sync: only the bytes that changed travel (weight_sync.delta = true).

    learner (DeltaEncoder)                        rollout worker (DeltaDecoder)
    pack new weights -> cur       (flat stream)
    base ^= cur  -> XOR against what the          decoder.version == ticket.delta_base,
                    workers serve (version b)       else refuse (the session sends full)
    zstd(base) -> wire bytes  ================>   current ^= unzstd(wire)
    base, cur = cur, base       (cur is version v)  engine.load_weights(layout.views(current))

Both ends keep the last version's flat byte stream (engine/weightsync/layout.py): the
encoder the one it last sent, each decoder the one it last applied. A version gap (the
session saw a worker that does not serve the encoder's base, a fresh worker, a changed
layout, the first sync, a delta that would not be smaller) sends the full stream instead,
and the decoder takes it as its new base. XOR is exact for any dtype (it works on bytes,
not values), so the applied weights equal the sent ones bit for bit, and the receiving
engine's fingerprint is checked as after any sync. An optimizer step changes most
elements' low mantissa bits and few high ones, so the XOR is mostly zero bytes and zstd
(level 1, the library pyarrow ships) squeezes them out; ``changed_frac`` (elements whose
bytes changed, over all elements) says how sparse a step really was.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

from engine.weightsync.layout import FlatLayout

ZSTD_LEVEL = 1          # level 1 compresses at ~GB/s; higher levels gain little on XORs
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class DeltaBaseError(RuntimeError):
    """A receiver was sent a delta against a version it does not hold."""


def _codec():
    import pyarrow as pa

    return pa.Codec("zstd", compression_level=ZSTD_LEVEL)


def _xor_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst ^= src over two uint8 streams of equal length (a multiple of 8: layout.ALIGN)."""
    torch.bitwise_xor(dst.view(torch.int64), src.view(torch.int64), out=dst.view(torch.int64))


def changed_elements(layout: FlatLayout, xor: torch.Tensor) -> tuple[int, int]:
    """(elements whose bytes differ, all elements) given the XOR stream of two versions."""
    changed = total = 0
    for s in layout.specs:
        size = torch.empty((), dtype=getattr(torch, s.dtype)).element_size()
        words = xor[s.offset:s.offset + s.nbytes].view(_INT_OF_SIZE[size])
        changed += int(torch.count_nonzero(words))
        total += words.numel()
    return changed, total


@dataclass(frozen=True)
class DeltaFrame:
    """What a delta-capable sender reports for one sync (rides on the Ticket)."""
    base: int | None          # the version the XOR is against; None: the full stream
    wire_bytes: int           # bytes that travel: compressed XOR, or the full payload
    changed: int = 0          # elements whose bytes changed (delta sends only)
    elements: int = 0


class DeltaEncoder:
    """The learner's end: remembers the stream of the version it last sent."""

    def __init__(self) -> None:
        self.layout: FlatLayout | None = None
        self.version: int | None = None
        self._base: torch.Tensor | None = None     # the stream of self.version
        self._cur: torch.Tensor | None = None

    def encode(self, named, layout: FlatLayout, version: int, base: int | None,
               cur: torch.Tensor | None = None) -> tuple[DeltaFrame, torch.Tensor | None]:
        """Pack ``named`` (version ``version``) into ``cur`` (a buffer of the transport's,
        e.g. the shared-memory file; default: the encoder's own). When every receiver
        serves ``base``, the version this encoder last sent, and the XOR compresses to
        less than the weights: (frame, the compressed XOR as a uint8 CPU tensor).
        Otherwise (a full frame, None): send the full stream, ``full_stream()``."""
        same = layout == self.layout and self._base is not None
        if not same:
            self.layout = layout
            self._base = torch.zeros(layout.nbytes, dtype=torch.uint8)
            self._cur = torch.zeros(layout.nbytes, dtype=torch.uint8) if cur is None else None
        own = cur is None
        cur = self._cur if own else cur
        layout.pack([t for _, t in named], cur)
        usable = same and base is not None and base == self.version
        frame, wire = DeltaFrame(None, layout.payload_bytes), None
        if usable:
            _xor_into(self._base, cur)                            # base := base ^ cur
            compressed = _codec().compress(self._base.numpy())
            if compressed.size < layout.payload_bytes:
                changed, elements = changed_elements(layout, self._base)
                frame = DeltaFrame(base, compressed.size, changed, elements)
                wire = torch.frombuffer(compressed, dtype=torch.uint8)
        if own:
            self._base, self._cur = self._cur, self._base
        else:
            self._base.copy_(cur)        # the transport's buffer changes at the next sync
        self.version = version
        return frame, wire

    def full_stream(self) -> torch.Tensor:
        """The stream of the version last encoded (what a full send carries)."""
        return self._base


class DeltaDecoder:
    """A rollout worker's end: holds the stream of the version it last applied."""

    def __init__(self) -> None:
        self.version: int | None = None
        self.current: torch.Tensor | None = None

    def target(self, layout: FlatLayout) -> torch.Tensor:
        """The buffer a full stream is written into (then ``took_full``)."""
        if self.current is None or self.current.numel() != layout.nbytes:
            self.current = torch.empty(layout.nbytes, dtype=torch.uint8)
            self.version = None
        return self.current

    def took_full(self, version: int) -> None:
        self.version = version

    def holds(self, frame: DeltaFrame) -> bool:
        """Whether this decoder holds the version ``frame``'s XOR is against."""
        return frame.base is not None and frame.base == self.version \
            and self.current is not None

    def check(self, frame: DeltaFrame) -> None:
        if not self.holds(frame):
            raise DeltaBaseError(
                f"delta weight sync against version {frame.base}, but this worker holds "
                f"version {self.version}; the sender must fall back to a full send")

    def take_full(self, flat: torch.Tensor, layout: FlatLayout, version: int) -> None:
        """A full send: ``flat`` (the whole stream) becomes the new base."""
        self.target(layout).copy_(flat)
        self.version = version

    def apply(self, frame: DeltaFrame, wire, layout: FlatLayout, version: int) -> None:
        """current ^= unzstd(wire): the stream of ``version``. ``wire`` is any buffer."""
        self.check(frame)
        raw = _codec().decompress(wire, decompressed_size=layout.nbytes)
        with warnings.catch_warnings():             # read-only buffer; it is only read
            warnings.simplefilter("ignore", UserWarning)
            xor = torch.from_numpy(np.frombuffer(raw, dtype=np.uint8))
        _xor_into(self.current, xor)
        self.version = version
