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

A rollout engine loads and fingerprints in one pass (``load_fingerprinted``), on two
threads (torch's copy and xxhash's update both release the GIL):

    copying thread, in name order               hashing thread (a Hasher), in the same order
    for each CHUNK_BYTES slice of a tensor:     hash the header, then each slice handed
        copy the incoming bytes into it,        over, while the next one is copied
        hand the slice just written over

XXH3's streaming state makes that the same digest as ``fingerprint`` over the served
tensors after the copy, and it is still the served bytes that are hashed (what the copy
wrote, not what was offered), so the fingerprint keeps its meaning. The hash reads each
slice from cache right after it was written, on another core, so a verified load takes
1.15-1.3x the copy alone ("memcpy + xxh3 in one pass" in bench/weight_sync.py, small
preset, 84 MB, on this 2-core box) against 1.45-1.6x hashing each slice on the copying
thread, as it did before, and 1.65-1.7x with a second pass. What is left is the plan made
before the copy, the last slice and the hashing thread's reads of what the other core
wrote (in a Ray worker, beside Ray's own threads: 1.3-1.35x); within a sync, the learner
hashes what it sent after the load when generation waits for it (WeightSyncSession).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Mapping

import numpy as np
import torch
import xxhash

# Copy this many bytes before handing them to the hashing thread: the slice is still in
# cache (L2/L3) when that thread reads it, and a few hand-overs per tensor keep the queue's
# cost (microseconds each) out of sight. Smaller slices pay more hand-overs; larger ones
# leave a longer last slice to hash after the copy ends (bench: small preset, 84 MB).
CHUNK_BYTES = 1 << 21


def _header(name: str, t: torch.Tensor) -> bytes:
    return f"{name}|{t.dtype}|{tuple(t.shape)}".encode()


def _raw(t: torch.Tensor) -> np.ndarray:
    """The tensor's bytes as a flat uint8 array over its own buffer (no copy when it is a
    contiguous CPU tensor; numpy's own view where it has the dtype: a third of torch's
    calls, which the per-sync plan of ``load_fingerprinted`` makes per tensor)."""
    t = t.detach()
    if t.device.type == "cpu" and t.is_contiguous():
        try:
            return t.numpy().reshape(-1).view(np.uint8)
        except (TypeError, RuntimeError):    # a dtype numpy lacks (bfloat16), a conj bit
            pass
    return t.contiguous().cpu().reshape(-1).view(torch.uint8).numpy()


def fingerprint(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    h = xxhash.xxh3_128()
    for name, t in sorted(named_tensors, key=lambda kv: kv[0]):
        h.update(_header(name, t))
        h.update(_raw(t))
    return h.hexdigest()


class Hasher:
    """XXH3-128 fed on a thread of its own, in the order ``update`` is called: the caller
    goes on (copying the next slice) while it hashes. The buffers handed over must not
    change until ``hexdigest`` returns; ``close`` stops it without a digest."""

    def __init__(self) -> None:
        self._h = xxhash.xxh3_128()
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="rlplane-fingerprint",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while (buf := self._q.get()) is not None:
                self._h.update(buf)
        except BaseException as exc:     # noqa: BLE001 - raised by hexdigest
            self._error = exc

    def update(self, buf) -> None:
        self._q.put(buf)

    def close(self) -> None:
        self._q.put(None)
        self._thread.join()

    def hexdigest(self) -> str:
        self.close()
        if self._error is not None:
            raise self._error
        return self._h.hexdigest()


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
        src_of = {id(dst): t.detach() for dst, t in incoming}   # the last of a repeated name
        plan = [_plan(name, dst, src_of.get(id(dst)))
                for name, dst in sorted(served.items(), key=lambda kv: kv[0])]
        h = Hasher()
        try:
            for header, dst, src, slices in plan:
                h.update(header)
                if slices is None:       # a converting copy, or nothing sent: whole, then hashed
                    if src is not None:
                        dst.copy_(src)
                    h.update(_raw(dst))
                    continue
                for d, s, view in slices:
                    d.copy_(s)
                    h.update(view)
        except BaseException:
            h.close()
            raise
    return nbytes, h.hexdigest()


def _plan(name: str, dst: torch.Tensor, src: torch.Tensor | None) -> tuple:
    """(header, dst, src, the CHUNK_BYTES slices (of dst, of src, of dst's bytes) to copy
    and hash, or None when the copy is not a byte copy or nothing was sent). Made before
    the copying starts: each torch call in the copying loop hands the GIL to the hashing
    thread and waits to get it back, and a loop that made its views as it went took
    1.4-1.5x a plain copy."""
    header = _header(name, dst)
    if src is None or not _byte_copyable(dst, src):
        return header, dst, src, None
    view = _raw(dst)
    if view.size <= CHUNK_BYTES:
        return header, dst, src, [(dst, src, view)]
    size = dst.element_size()
    step = CHUNK_BYTES // size                          # whole elements per slice
    d, s = dst.reshape(-1), src.reshape(-1)
    return header, dst, src, [(d[a:a + step], s[a:a + step], view[a * size:(a + step) * size])
                              for a in range(0, d.numel(), step)]
