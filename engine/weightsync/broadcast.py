"""torch.distributed broadcast transport: learner = rank 0, rollout workers = ranks 1..n.

    setup   sender: TCPStore (master) -> join_info (host, port, world, backend)
            every rank: its own ProcessGroupGloo / ProcessGroupNCCL on that store. Not the
            default group: vLLM (and a DDP learner) keep theirs.
    sync    ticket = (version, layout, bucket_bytes); the stream is cut into buckets

    rank 0  pack b0 -> [A] | pack b1 -> [B] | wait b0, pack b2 -> [A] | ...
            bcast [A] ======> bcast [B] ======> bcast [A] ======>          (double_buffer)
    rank k  recv b0, b1, b2 ... straight into its flat stream buffer
            -> engine.load_weights(layout.views(flat)) -> fingerprint

Packing bucket i+1 overlaps the broadcast of bucket i (gloo sends on its own thread; NCCL
on its own stream). "nccl" is the same code with CUDA buffers.

With weight_sync.delta (gloo only) rank 0 broadcasts the zstd-compressed XOR against the
version every worker serves (its length is in the ticket), or the full stream after a
version gap; each rank keeps the stream it last applied (engine/weightsync/delta.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from engine.weightsync.base import Ticket, TransportUnavailable, check_version, load_checked
from engine.weightsync.delta import DeltaDecoder, DeltaEncoder
from engine.weightsync.layout import FlatLayout

MIB = 2**20


@dataclass(frozen=True)
class BroadcastJoin:
    host: str
    port: int
    world_size: int


def _host() -> str:
    import ray

    return ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"


def _device(backend: str) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" \
        else torch.device("cpu")


def _group(backend: str, store, rank: int, world_size: int, timeout: timedelta):
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world_size, timeout)
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = timeout
    return dist.ProcessGroupNCCL(store, rank, world_size, opts)


def _require_cpu_for_delta(cfg) -> None:
    if cfg.delta and cfg.backend != "gloo":
        raise TransportUnavailable(
            'weight_sync.delta = true compresses on the CPU and weight_sync.backend = "nccl" '
            'moves CUDA buffers; use backend = "gloo" with delta, or set delta = false')


def _broadcast(group, tensor: torch.Tensor):
    opts = dist.BroadcastOptions()
    opts.rootRank, opts.rootTensor = 0, 0
    return group.broadcast([tensor], opts)


def _bucketed(group, stream: torch.Tensor, bucket_bytes: int) -> None:
    """Broadcast one contiguous uint8 stream in buckets, all in flight at once (both ends
    cut it the same way)."""
    works = [_broadcast(group, stream[a:a + bucket_bytes])
             for a in range(0, stream.numel(), bucket_bytes)]
    for work in works:
        work.wait()


class BroadcastSender:
    name = "broadcast"

    def __init__(self, cfg, world_size: int):
        self.cfg, self.world_size = cfg, world_size
        self.timeout = timedelta(seconds=cfg.timeout_s)
        self.store = dist.TCPStore(_host(), 0, world_size, is_master=True,
                                   wait_for_workers=False, timeout=self.timeout)
        self.group = None
        self.bucket_bytes = cfg.bucket_mb * MIB
        self._staging: list[torch.Tensor] = []
        self._pending: tuple[FlatLayout, list[torch.Tensor]] | None = None
        _require_cpu_for_delta(cfg)
        self._delta = DeltaEncoder() if cfg.delta else None
        self._stream: torch.Tensor | None = None     # delta: the bytes transfer() sends

    def join_info(self) -> BroadcastJoin:
        return BroadcastJoin(self.store.host, self.store.port, self.world_size)

    def connect(self) -> None:
        self.group = _group(self.cfg.backend, self.store, 0, self.world_size, self.timeout)

    def prepare(self, named_tensors: Sequence[tuple[str, torch.Tensor]], version: int,
                initial: bool = False, base: int | None = None) -> Ticket:
        layout = FlatLayout.of(named_tensors)
        if self._delta is not None:
            frame, wire = self._delta.encode(named_tensors, layout, version, base)
            self._stream = wire if wire is not None else self._delta.full_stream()
            return Ticket(self.name, version, initial, layout, self.bucket_bytes, delta=frame)
        self._pending = (layout, [t for _, t in named_tensors])
        return Ticket(self.name, version, initial, layout, self.bucket_bytes)

    def _buffers(self, size: int) -> list[torch.Tensor]:
        n = 2 if self.cfg.double_buffer else 1
        if len(self._staging) != n or self._staging[0].numel() < size:
            self._staging = [torch.empty(size, dtype=torch.uint8,
                                         device=_device(self.cfg.backend)) for _ in range(n)]
        return self._staging

    def transfer(self) -> None:
        if self._delta is not None:          # one contiguous CPU stream: no packing
            stream, self._stream = self._stream, None
            _bucketed(self.group, stream, self.bucket_bytes)
            return
        layout, tensors = self._pending
        self._pending = None
        buckets = layout.buckets(self.bucket_bytes)
        buffers = self._buffers(min(self.bucket_bytes, layout.nbytes))
        in_flight = [None] * len(buffers)            # the broadcast still reading buffer j
        for i, (a, b) in enumerate(buckets):
            j = i % len(buffers)
            if in_flight[j] is not None:
                in_flight[j].wait()
            out = buffers[j][:b - a]
            layout.pack(tensors, out, start=a)
            if out.is_cuda:
                torch.cuda.current_stream().synchronize()   # NCCL's stream reads it next
            in_flight[j] = _broadcast(self.group, out)
        for work in in_flight:
            if work is not None:
                work.wait()

    def close(self) -> None:
        self.group = None


class BroadcastReceiver:
    def __init__(self, cfg, join_info: BroadcastJoin, rank: int):
        self.cfg = cfg
        timeout = timedelta(seconds=cfg.timeout_s)
        self.store = dist.TCPStore(join_info.host, join_info.port, join_info.world_size,
                                   is_master=False, timeout=timeout)
        self.group = _group(cfg.backend, self.store, rank, join_info.world_size, timeout)
        self._flat: torch.Tensor | None = None
        _require_cpu_for_delta(cfg)
        self._delta = DeltaDecoder() if cfg.delta else None

    def receive(self, ticket: Ticket, engine):
        layout, frame = ticket.layout, ticket.delta
        if frame is not None:
            if frame.base is None:
                target = self._delta.target(layout)
                _bucketed(self.group, target, ticket.payload)
                self._delta.version = None       # set only once the version is accepted
            else:
                wire = torch.empty(frame.wire_bytes, dtype=torch.uint8)
                _bucketed(self.group, wire, ticket.payload)
            # the whole collective is done: refusing now cannot hang rank 0
            check_version(ticket, engine.weight_version())
            if frame.base is None:
                self._delta.took_full(ticket.version)
            else:
                self._delta.apply(frame, wire.numpy(), layout, ticket.version)
            return load_checked(engine, ticket, layout.views(self._delta.current))
        layout = ticket.layout
        if self._flat is None or self._flat.numel() != layout.nbytes:
            self._flat = torch.empty(layout.nbytes, dtype=torch.uint8,
                                     device=_device(self.cfg.backend))
        works = [_broadcast(self.group, self._flat[a:b])
                 for a, b in layout.buckets(ticket.payload)]
        for work in works:
            work.wait()
        # a stale version is refused only now: leaving the collective early would hang rank 0
        return load_checked(engine, ticket, layout.views(self._flat))

    def close(self) -> None:
        self.group = None
