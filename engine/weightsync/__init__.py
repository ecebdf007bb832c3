"""Weight-sync transports, built by name from ``cfg.weight_sync``.

    sender   = build_sender(cfg.weight_sync, world_size=1 + n_workers)   # learner process
    receiver = build_receiver(cfg.weight_sync, sender.join_info(), rank)  # each worker, 1..n

engine/weightsync/session.py drives every one of them ("in_place" too, whose receiver is
in the learner's process). Modules load lazily, so a shared-memory run never imports
torch.distributed and a CPU run never touches CUDA.
"""

from __future__ import annotations

import importlib

_TRANSPORTS: dict[str, tuple[str, str]] = {      # type -> (sender, receiver)
    "in_place": ("engine.weightsync.inplace:InPlaceSender",
                 "engine.weightsync.inplace:InPlaceReceiver"),
    "shm": ("engine.weightsync.shm:ShmSender", "engine.weightsync.shm:ShmReceiver"),
    "object_store": ("engine.weightsync.objectstore:ObjectStoreSender",
                     "engine.weightsync.objectstore:ObjectStoreReceiver"),
    "broadcast": ("engine.weightsync.broadcast:BroadcastSender",
                  "engine.weightsync.broadcast:BroadcastReceiver"),
    "checkpoint": ("engine.weightsync.checkpoint:CheckpointFileSender",
                   "engine.weightsync.checkpoint:CheckpointFileReceiver"),
    "cuda_ipc": ("engine.weightsync.cuda_ipc:CudaIpcSender",
                 "engine.weightsync.cuda_ipc:CudaIpcReceiver"),
    "vllm_native": ("engine.weightsync.vllm_native:VllmNativeSender",
                    "engine.weightsync.vllm_native:VllmNativeReceiver"),
}


def _load(cfg, side: int):
    module, name = _TRANSPORTS[cfg.type][side].split(":")
    return getattr(importlib.import_module(module), name)


def build_sender(cfg, world_size: int = 2):
    """The learner's end; ``world_size`` counts the learner and every rollout worker."""
    return _load(cfg, 0)(cfg, world_size)


def build_receiver(cfg, join_info: object = None, rank: int = 1, engine=None):
    """A rollout worker's end; ``rank`` is 1..world_size-1 (the learner is 0). ``engine``
    is the worker's rollout engine, which receivers that join inside it need
    ("vllm_native": vLLM's worker joins the learner)."""
    receiver = _load(cfg, 1)
    if getattr(receiver, "needs_engine", False):
        return receiver(cfg, join_info, rank, engine)
    return receiver(cfg, join_info, rank)
