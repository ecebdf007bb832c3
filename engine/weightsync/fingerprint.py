"""An exact, fast fingerprint of a set of named tensors.

XXH3-128 (xxhash) over, for every tensor in name order, its (name, dtype, shape) header
and the XXH3-128 digest of its raw bytes, as 32 hex digits. Both sides of a weight sync
compute it from the tensors they actually hold, so a sync that silently did not apply (or
applied to a copy the engine does not serve) shows up as a mismatch. It hashes the
tensor's own buffer (no bytes copy), so two tensor sets match exactly when their names,
dtypes, shapes and every byte match, in any dtype: a one-ulp change in one element
changes it. XXH3 is not a cryptographic hash (nothing here defends against an adversary
who crafts weights); it reads 20-50 GB/s on one core of this CPU box, ~14x SHA-256
(bench/weight_sync.py prints both on the same tensors), so verifying a sync no longer
dominates it.

A rollout engine loads and fingerprints in one pass (``load_fingerprinted``), on two
threads, each taking about half the bytes, whole tensors:

    for each of its tensors, for each SLICE_BYTES slice:
        copy the incoming bytes into the served tensor (numpy: no GIL, no torch threads)
        hash that slice of the served tensor while it is still in this core's cache
    -> the tensor's digest;   the digests then go into the fingerprint in name order

Each tensor's digest is its own, so the two threads need no order between them, and the
bytes hashed are still the served ones (what the copy wrote, not what was offered): the
fingerprint keeps its meaning. On the small preset (84 MB, this 2-core box, in process) a
verified load took 0.9x a torch copy on one thread and 1.06-1.1x torch's copy on two,
where hashing one stream on a second thread behind the copy took 1.25x and 1.8x (xxhash
holds the GIL while it hashes: here a copy on the other thread goes on meanwhile). In a
sync (bench/weight_sync.py, shm) a worker serves a verified sync 1.04-1.08x as late as an
unverified one, against 1.18-1.22x before.
``stream_fingerprint`` is that earlier definition (one XXH3 stream over every header and
byte), kept to check checkpoints written with it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import torch
import xxhash

# A verified load copies and hashes this many bytes at a time, so the hash reads what the
# copy just wrote from the core's own cache (L2: 0.5-2 MiB on the CPUs measured). Smaller
# slices pay more Python calls; 256 KiB-2 MiB measured within 4 % (bench: small preset).
SLICE_BYTES = 1 << 19

# What a checkpoint's state.json records beside its fingerprint: 2 = per-tensor digests
# (``fingerprint``); a checkpoint without it was written with ``stream_fingerprint``.
FINGERPRINT_SCHEME = 2


def _header(name: str, t: torch.Tensor) -> bytes:
    return f"{name}|{t.dtype}|{tuple(t.shape)}".encode()


def _raw(t: torch.Tensor) -> np.ndarray:
    """The tensor's bytes as a flat uint8 array over its own buffer (no copy when it is a
    contiguous CPU tensor, so a copy into it writes the tensor; numpy's own view where it
    has the dtype: a third of torch's calls)."""
    t = t.detach()
    if t.device.type == "cpu" and t.is_contiguous():
        try:
            return t.numpy().reshape(-1).view(np.uint8)
        except (TypeError, RuntimeError):    # a dtype numpy lacks (bfloat16), a conj bit
            pass
    return t.contiguous().cpu().reshape(-1).view(torch.uint8).numpy()


def _digest(t: torch.Tensor) -> bytes:
    return xxhash.xxh3_128_digest(_raw(t))


def _fold(named_tensors: Iterable[tuple[str, torch.Tensor]], part) -> str:
    """XXH3-128 over each tensor's header and ``part(name, tensor)``, in name order."""
    h = xxhash.xxh3_128()
    for name, t in sorted(named_tensors, key=lambda kv: kv[0]):
        h.update(_header(name, t))
        h.update(part(name, t))
    return h.hexdigest()


def fingerprint(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    return _fold(named_tensors, lambda _, t: _digest(t))


def stream_fingerprint(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """The fingerprint as defined before 2026-12-05 (one XXH3-128 stream over every header
    and byte in name order): what checkpoints written before then record."""
    return _fold(named_tensors, lambda _, t: _raw(t))


def load_fingerprinted(served: Mapping[str, torch.Tensor],
                       named_tensors: Iterable[tuple[str, torch.Tensor]],
                       verify: bool = True) -> tuple[int, str]:
    """Copy each incoming tensor into the served tensor of its name; returns (bytes
    copied, ``fingerprint(served.items())`` after the copy, or "" unless ``verify``).

    A name ``served`` lacks raises KeyError before anything is copied. Unverified, torch
    copies (on the caller's torch threads). Verified, the tensors are split between this
    thread and a helper, each copying and hashing its own (module doc); an error on
    either raises once both have stopped, so nothing is written after this returns (a
    byte copy is numpy's: it does not bump the served tensors' autograd version). The
    served tensors must not alias one another (a tied embedding is served once, as
    named_parameters lists it). Served tensors that were not sent are hashed as they are;
    a copy that converts, broadcasts or runs on a device is done whole by torch and its
    result hashed."""
    incoming = [(served[name], t) for name, t in named_tensors]      # KeyError: unknown
    nbytes = sum(dst.numel() * dst.element_size() for dst, _ in incoming)
    if not verify:
        with torch.no_grad():
            for dst, t in incoming:
                dst.copy_(t)
        return nbytes, ""
    src_of = {id(dst): t.detach() for dst, t in incoming}   # the last of a repeated name
    jobs = [(name, dst, src_of.get(id(dst))) for name, dst in served.items()]
    mine, theirs = _halves(jobs)
    digests: dict[str, bytes] = {}
    inference = torch.is_inference_mode_enabled()       # the helper runs in the same mode
    helper = _helpers().submit(_copy_and_digest, theirs, digests, inference)
    try:
        _copy_and_digest(mine, digests, inference)
    except BaseException as exc:
        if (theirs_failed := _stopped(helper)) is not None:
            exc.add_note(f"the helper thread failed too: {theirs_failed!r}")
        raise
    if (error := _stopped(helper)) is not None:
        raise error
    return nbytes, _fold(served.items(), lambda name, _: digests[name])


def _halves(jobs: list[tuple]) -> tuple[list[tuple], list[tuple]]:
    """``jobs`` in two lists of about equal bytes (largest first, each to the lighter)."""
    out: tuple[list[tuple], list[tuple]] = ([], [])
    load = [0, 0]
    for job in sorted(jobs, key=lambda j: -j[1].numel() * j[1].element_size()):
        side = 0 if load[0] <= load[1] else 1
        out[side].append(job)
        load[side] += job[1].numel() * job[1].element_size()
    return out


def _stopped(helper: Future) -> BaseException | None:
    """Wait until ``helper`` has stopped (an interrupt meanwhile is raised after it) and
    return its error: nothing writes the served tensors once this returns."""
    interrupted = None
    while True:
        try:
            error = helper.exception()
            break
        except BaseException as exc:        # noqa: BLE001 - KeyboardInterrupt: wait on
            interrupted = exc
    if interrupted is not None:
        raise interrupted
    return error


def _copy_and_digest(jobs: list[tuple], digests: dict[str, bytes], inference: bool) -> None:
    """Each (name, served tensor, incoming tensor or None): copied, then its digest. Grad
    and inference mode are per thread: the caller's are set again here."""
    with torch.no_grad(), torch.inference_mode(inference):
        for name, dst, src in jobs:
            if src is None or not _byte_copyable(dst, src):
                if src is not None:
                    dst.copy_(src)
                digests[name] = _digest(dst)
                continue
            d, s, h = _raw(dst), _raw(src), xxhash.xxh3_128()
            for a in range(0, d.size, SLICE_BYTES):
                part = d[a:a + SLICE_BYTES]
                np.copyto(part, s[a:a + SLICE_BYTES])
                h.update(part)
            digests[name] = h.digest()


_HELPERS: tuple[int, ThreadPoolExecutor] | None = None


def _helpers() -> ThreadPoolExecutor:
    """The verified loads' second threads, one pool per process (a forked child makes its
    own: threads do not survive a fork), as many as loads run at once (engines on threads
    of one process), idle ones reused."""
    global _HELPERS
    if _HELPERS is None or _HELPERS[0] != os.getpid():
        _HELPERS = (os.getpid(), ThreadPoolExecutor(8, thread_name_prefix="rlplane-fingerprint"))
    return _HELPERS[1]


def _byte_copyable(dst: torch.Tensor, src: torch.Tensor) -> bool:
    """``dst.copy_(src)`` is a plain byte copy: same dtype and shape, both contiguous on
    the CPU (else copy_ converts, broadcasts or crosses a device, and is left to do so)."""
    return (dst.device.type == src.device.type == "cpu" and dst.dtype == src.dtype
            and dst.shape == src.shape and dst.is_contiguous() and src.is_contiguous()
            and not (src.is_conj() or src.is_neg()))
