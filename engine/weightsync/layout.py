"""Where each tensor lives in one flat byte stream: the wire format of every transport.

    layout = FlatLayout.of(named_tensors)                  # names, dtypes, shapes, offsets
    flat   = torch.empty(layout.nbytes, dtype=torch.uint8)
    layout.pack(tensors, flat)                             # one copy in
    named  = layout.views(flat)                            # zero-copy (name, tensor) views

    stream  | t0 .......... |pad| t1 ...... |pad| t2 ............................ |
    buckets | b0                   | b1                   | b2             | b3 |
    layout.buckets(B) cuts the stream into ranges of B bytes; layout.pack(tensors, out,
    start) fills ``out`` with stream bytes [start, start + len(out)), so one tensor can
    span several buckets and one bucket can hold many tensors.

Offsets are aligned to ALIGN bytes, so every view is aligned for its dtype. Works the
same for CPU and CUDA tensors (the stream is a uint8 tensor on either).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

ALIGN = 64


def dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, name)
    assert isinstance(dtype, torch.dtype), name
    return dtype


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes as a flat uint8 view (a copy only if it was not contiguous)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str                    # torch dtype name, "float32"
    shape: tuple[int, ...]
    offset: int                   # first byte in the stream
    nbytes: int


@dataclass(frozen=True)
class FlatLayout:
    specs: tuple[TensorSpec, ...]
    nbytes: int                   # stream length, padding included

    @classmethod
    def of(cls, named_tensors: Sequence[tuple[str, torch.Tensor]]) -> FlatLayout:
        specs, offset = [], 0
        for name, t in named_tensors:
            n = t.numel() * t.element_size()
            specs.append(TensorSpec(name, str(t.dtype).removeprefix("torch."),
                                    tuple(t.shape), offset, n))
            offset += -(-n // ALIGN) * ALIGN
        return cls(tuple(specs), offset)

    @property
    def payload_bytes(self) -> int:
        return sum(s.nbytes for s in self.specs)

    def buckets(self, bucket_bytes: int) -> list[tuple[int, int]]:
        return [(a, min(a + bucket_bytes, self.nbytes))
                for a in range(0, self.nbytes, bucket_bytes)]

    def pack(self, tensors: Sequence[torch.Tensor], out: torch.Tensor, start: int = 0) -> None:
        """Copy stream bytes [start, start + len(out)) from ``tensors`` (in spec order)
        into the uint8 tensor ``out``. Padding bytes are left as they are."""
        stop = start + out.numel()
        for spec, t in zip(self.specs, tensors, strict=True):
            a, b = max(spec.offset, start), min(spec.offset + spec.nbytes, stop)
            if a < b:
                src = as_bytes(t)[a - spec.offset:b - spec.offset]
                out[a - start:b - start].copy_(src)

    def views(self, flat: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """(name, tensor) views into the uint8 stream ``flat``; nothing is copied."""
        return [(s.name, flat[s.offset:s.offset + s.nbytes].view(dtype_of(s.dtype))
                 .reshape(s.shape)) for s in self.specs]
