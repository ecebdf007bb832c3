"""An exact, fast fingerprint of a set of named tensors.

XXH3-128 (xxhash) over (name, dtype, shape, raw bytes) of every tensor in name order, as
32 hex digits. Both sides of a weight sync compute it from the tensors they actually hold,
so a sync that silently did not apply (or applied to a copy the engine does not serve)
shows up as a mismatch. It hashes the tensor's own buffer (no bytes copy), so two tensor
sets match exactly when their names, dtypes, shapes and every byte match, in any dtype: a
one-ulp change in one element changes it. XXH3 is not a cryptographic hash (nothing here
defends against an adversary who crafts weights); it reads ~10 GB/s on one core of this
CPU box, about 7x SHA-256 with the CPU's SHA extensions (bench/weight_sync.py prints both
on the same tensors), so verifying a sync no longer dominates it.

A rollout engine loads and fingerprints in one pass (``load_fingerprinted``):

    for each served tensor, in name order:      hash its header
        for each CHUNK_BYTES slice:             copy the incoming bytes into it,
                                                hash the slice just written (still in L2)

XXH3's streaming state makes that the same digest as ``fingerprint`` over the served
tensors after the copy, and it is still the served bytes that are hashed (what the copy
wrote, not what was offered), so the fingerprint keeps its meaning. Reading the weights
back from L2 (~45 GB/s) instead of memory (~11 GB/s) about halves what verifying adds to a
load on this box: small preset (84 MB), 1.3-1.4x an unverified copy against 1.55-1.65x
with a second pass ("memcpy + xxh3 in one pass" in bench/weight_sync.py). It cannot
vanish: one core hashes at most ~45 GB/s and copies at ~6.5.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import torch
import xxhash

# Copy and hash this many bytes at a time: the source and destination slices (2 x 256 KiB)
# stay in one core's L2 between the copy and the hash. Smaller slices pay numpy's call
# overhead per slice; larger ones spill to memory (bench: small preset, 84 MB).
CHUNK_BYTES = 1 << 18


def _header(name: str, t: torch.Tensor) -> bytes:
    return f"{name}|{t.dtype}|{tuple(t.shape)}".encode()


def _raw(t: torch.Tensor) -> np.ndarray:
    """The tensor's bytes as a flat uint8 array over its own buffer (no copy when it is a
    contiguous CPU tensor)."""
    return t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()


def fingerprint(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    h = xxhash.xxh3_128()
    for name, t in sorted(named_tensors, key=lambda kv: kv[0]):
        h.update(_header(name, t))
        h.update(_raw(t))
    return h.hexdigest()


def _byte_copyable(dst: torch.Tensor, src: torch.Tensor) -> bool:
    """``dst.copy_(src)`` is a plain byte copy: same dtype and shape, both contiguous on
    the CPU (else copy_ converts, broadcasts or crosses a device, and is left to do so)."""
    return (dst.device.type == src.device.type == "cpu" and dst.dtype == src.dtype
            and dst.shape == src.shape and dst.is_contiguous() and src.is_contiguous())


def load_fingerprinted(served: Mapping[str, torch.Tensor],
                       named_tensors: Iterable[tuple[str, torch.Tensor]],
                       verify: bool = True) -> tuple[int, str]:
    """Copy each incoming tensor into the served tensor of its name; returns (bytes
    copied, ``fingerprint(served.items())`` after the copy, or "" unless ``verify``).

    A name ``served`` lacks raises KeyError before anything is copied. The served tensors
    must not alias one another (a tied embedding is served once, as named_parameters lists
    it): the one pass hashes each right after writing it. Served tensors that were not
    sent are hashed as they are; a copy that converts, broadcasts or runs on a device is
    done whole by torch and its result hashed."""
    incoming = [(served[name], t) for name, t in named_tensors]      # KeyError: unknown
    nbytes = sum(dst.numel() * dst.element_size() for dst, _ in incoming)
    with torch.no_grad():
        if not verify:
            for dst, t in incoming:
                dst.copy_(t)
            return nbytes, ""
        src_of = {id(dst): t for dst, t in incoming}          # the last of a repeated name
        h = xxhash.xxh3_128()
        for name in sorted(served):
            dst = served[name]
            h.update(_header(name, dst))
            src = src_of.get(id(dst))
            if src is not None and _byte_copyable(dst, src.detach()):
                d, s = _raw(dst), _raw(src)
                for a in range(0, d.size, CHUNK_BYTES):
                    chunk = d[a:a + CHUNK_BYTES]
                    np.copyto(chunk, s[a:a + CHUNK_BYTES])
                    h.update(chunk)
                continue
            if src is not None:
                dst.copy_(src)
            h.update(_raw(dst))
    return nbytes, h.hexdigest()
