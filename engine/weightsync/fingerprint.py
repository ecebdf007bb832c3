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
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import xxhash


def fingerprint(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    h = xxhash.xxh3_128()
    for name, t in sorted(named_tensors, key=lambda kv: kv[0]):
        t = t.detach()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.contiguous().cpu().reshape(-1).view(torch.uint8).numpy())  # no bytes copy
    return h.hexdigest()
