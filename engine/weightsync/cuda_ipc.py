"""CUDA IPC transport: rollout workers on the learner's GPU open its memory directly.

    learner                                       rollout worker (same GPU)
    prepare: layout.pack(tensors, flat)  (one device copy, a snapshot the learner can
             move on from) ; handle = reduce_tensor(flat)
    ticket = (version, layout, handle)  ------->  flat = rebuild(handle) on this device
                                                  engine.load_weights(layout.views(flat))

One handle for the whole stream: opening an IPC handle costs far more than a tensor's
copy. The worker maps the handle on its current device, so learner and worker must see
the same physical GPU (colocated placement). CPU-only processes refuse this transport.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.weightsync.base import (
    ReceiverDefaults,
    SenderDefaults,
    Ticket,
    TransportUnavailable,
    load_checked,
)
from engine.weightsync.layout import FlatLayout

_STORAGE_DEVICE = 6      # index of the device in torch's rebuild_cuda_tensor arguments


def require_cuda() -> None:
    if not torch.cuda.is_available():
        raise TransportUnavailable(
            'weight_sync.type = "cuda_ipc" needs CUDA in the learner and every rollout '
            'worker, and this process sees no GPU; on CPU set weight_sync.type = "shm" '
            '(one node) or "broadcast" (any placement)')


class CudaIpcSender(SenderDefaults):
    name = "cuda_ipc"

    def __init__(self, cfg, world_size: int):
        require_cuda()
        self._flat: torch.Tensor | None = None

    def prepare(self, named_tensors: Sequence[tuple[str, torch.Tensor]], version: int,
                initial: bool = False) -> Ticket:
        from torch.multiprocessing.reductions import reduce_tensor

        layout = FlatLayout.of(named_tensors)
        if self._flat is None or self._flat.numel() != layout.nbytes:
            self._flat = torch.empty(layout.nbytes, dtype=torch.uint8, device="cuda")
        layout.pack([t for _, t in named_tensors], self._flat)
        torch.cuda.current_stream().synchronize()      # workers read it from other processes
        return Ticket(self.name, version, initial, layout, reduce_tensor(self._flat))

    def close(self) -> None:
        self._flat = None


class CudaIpcReceiver(ReceiverDefaults):
    def __init__(self, cfg, join_info: object, rank: int):
        require_cuda()

    def receive(self, ticket: Ticket, engine):
        rebuild, args = ticket.payload
        args = list(args)
        args[_STORAGE_DEVICE] = torch.cuda.current_device()
        flat = rebuild(*args)
        return load_checked(engine, ticket, ticket.layout.views(flat))
