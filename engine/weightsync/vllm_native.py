"""vLLM's own weight-transfer API as a transport: weight_sync.type = "vllm_native".

vLLM ships trainer -> inference weight-transfer engines (vllm.distributed.weight_transfer).
The rollout engine is started with ``weight_transfer_config={"backend": B}``; each of its
workers then owns a WeightTransferEngine and exposes, through ``collective_rpc``:

    init_weight_transfer_engine(init_info)   join the trainer (a rendezvous for collectives)
    start_weight_update()                     layerwise reload begins
    update_weights(update_info)               receive the bytes, model.load_weights(...)
    finish_weight_update()                    layerwise reload ends: vLLM re-runs its own
                                              post-load processing (repacking for its CPU
                                              kernels, fused layouts, quantization)

so the weights enter vLLM the way vLLM's own loader puts them there, not through a
``reload_weights`` call reaching into the model. In rlplane's two-sided seam:

    learner (rank 0)                            rollout worker k (VllmRollout)
    join_info() ----------------------------->  init_weight_transfer_engine   (receiver
    connect(): open the rank-0 endpoint <===>     setup; the two meet here)
    prepare(v): ticket(v, layout, update_info)  receive(ticket):
    transfer(): bytes =====================>      start / update_weights / finish,
                                                  reset_prefix_cache, version, and the
                                                  fingerprint of what vLLM now serves

Backends (weight_sync.backend):
    "gloo"  rlplane's engine, registered with vLLM's factory as "rlplane_gloo": the flat
            stream broadcast in buckets over a gloo group (CPU tensors). Runs everywhere;
            this is what CPU machines and CI run.
    "nccl"  vLLM's NCCLWeightTransferEngine (packed NCCL broadcast). The trainer end uses
            vLLM's own rank-0 endpoint (nccl_common.trainer_init) and packed producer.
    "ipc"   vLLM's IPCWeightTransferEngine: the worker opens the learner's CUDA tensors
            through per-tensor IPC handles (learner and worker on the same GPU).
"nccl" and "ipc" need CUDA in the learner and every worker and refuse otherwise, naming
the fix; the config also refuses "nccl" on a colocated placement (NCCL takes no two ranks
on one GPU) and "ipc" on a disaggregated one (IPC needs the same GPU). vLLM's NCCL group
has no timeout: a worker that fails before it joins a sync's broadcast leaves the
learner waiting in transfer() (gloo gives up after weight_sync.timeout_s).
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch

from engine.weightsync.base import Ticket, TransportUnavailable, check_version
from engine.weightsync.broadcast import BroadcastSender, _broadcast, _group, _host
from engine.weightsync.layout import FlatLayout, TensorSpec

MIB = 2**20
GLOO_BACKEND = "rlplane_gloo"          # the name rlplane's engine has in vLLM's factory


def vllm_backend_name(backend: str) -> str:
    """weight_sync.backend -> the name vLLM's WeightTransferEngineFactory knows."""
    return GLOO_BACKEND if backend == "gloo" else backend


def require_cuda(backend: str) -> None:
    if backend != "gloo" and not torch.cuda.is_available():
        raise TransportUnavailable(
            f'weight_sync.backend = "{backend}" is vLLM\'s CUDA weight-transfer engine and '
            f'this process sees no GPU; on CPU set weight_sync.backend = "gloo" (the same '
            f'vLLM lifecycle over a gloo group)')


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def update_info(layout: FlatLayout, **extra) -> dict:
    """What vLLM's update_weights takes for this stream (names, dtypes, shapes: the fields
    vLLM's NCCL and IPC engines share), plus the byte layout rlplane's engine cuts it by."""
    return {"names": [s.name for s in layout.specs],
            "dtype_names": [s.dtype for s in layout.specs],
            "shapes": [list(s.shape) for s in layout.specs], **extra}


# --------------------------------------------------------------------------- worker side

def register_gloo_engine() -> None:
    """Make "rlplane_gloo" known to vLLM's factory in this process (the worker's, since
    the engine runs in-process). Idempotent."""
    from vllm.distributed.weight_transfer import WeightTransferEngineFactory

    if GLOO_BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(GLOO_BACKEND, _gloo_engine_class())


def _gloo_engine_class():
    from vllm.distributed.weight_transfer.base import (
        WeightTransferEngine,
        WeightTransferInitInfo,
        WeightTransferUpdateInfo,
    )

    @dataclass
    class GlooInitInfo(WeightTransferInitInfo):
        host: str
        port: int
        world_size: int
        rank: int
        timeout_s: float = 300.0

    @dataclass
    class GlooUpdateInfo(WeightTransferUpdateInfo):
        names: list[str]
        dtype_names: list[str]
        shapes: list[list[int]]
        offsets: list[int]
        nbytes: int
        bucket_bytes: int

        def layout(self) -> FlatLayout:
            specs = []
            for name, dtype, shape, offset in zip(self.names, self.dtype_names, self.shapes,
                                                  self.offsets, strict=True):
                n = torch.Size(shape).numel() * getattr(torch, dtype).itemsize
                specs.append(TensorSpec(name, dtype, tuple(shape), offset, n))
            return FlatLayout(tuple(specs), self.nbytes)

    class GlooWeightTransferEngine(WeightTransferEngine[GlooInitInfo, GlooUpdateInfo]):
        """vLLM's checkpoint-format lifecycle (layerwise reload) over a gloo broadcast of
        rlplane's flat stream: the CPU counterpart of vLLM's NCCL engine."""

        init_info_cls = GlooInitInfo
        update_info_cls = GlooUpdateInfo

        def __init__(self, config, vllm_config, device, model):
            super().__init__(config, vllm_config, device, model)
            self.group = None
            self._flat: torch.Tensor | None = None

        def init_transfer_engine(self, init_info: GlooInitInfo) -> None:
            import torch.distributed as dist

            timeout = timedelta(seconds=init_info.timeout_s)
            store = dist.TCPStore(init_info.host, init_info.port, init_info.world_size,
                                  is_master=False, timeout=timeout)
            self.group = _group("gloo", store, init_info.rank, init_info.world_size, timeout)

        def start_weight_update(self) -> None:
            from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

            initialize_layerwise_reload(self.model)

        def finish_weight_update(self) -> None:
            from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

            finalize_layerwise_reload(self.model, self.model_config)

        def update_weights(self, update_info: dict) -> None:
            # the base class ends with torch.accelerator.synchronize(), which a CPU-only
            # process has no accelerator for; gloo's wait() below already completed it
            self.receive_weights(self.parse_update_info(update_info))

        def receive_weights(self, update_info: GlooUpdateInfo) -> None:
            if self.group is None:
                raise RuntimeError("rlplane_gloo weight transfer: init_weight_transfer_engine "
                                   "was not called")
            layout = update_info.layout()
            if self._flat is None or self._flat.numel() != layout.nbytes:
                self._flat = torch.empty(layout.nbytes, dtype=torch.uint8)
            works = [_broadcast(self.group, self._flat[a:b])
                     for a, b in layout.buckets(update_info.bucket_bytes)]
            for work in works:
                work.wait()
            self.model.load_weights(layout.views(self._flat))

        def shutdown(self) -> None:
            self.group = None

    return GlooWeightTransferEngine


class VllmNativeReceiver:
    """A rollout worker's end. Built with the worker's engine (a VllmRollout started with
    this backend), because joining the trainer happens inside vLLM's worker at setup."""

    needs_engine = True

    def __init__(self, cfg, join_info: dict, rank: int, engine):
        require_cuda(cfg.backend)
        info = dict(join_info)
        if cfg.backend == "gloo":
            info.update(rank=rank, timeout_s=cfg.timeout_s)
        elif cfg.backend == "nccl":
            info.update(rank_offset=rank)        # vLLM adds the worker's own TP rank
        engine.init_weight_transfer(info)

    def receive(self, ticket: Ticket, engine):
        try:
            check_version(ticket, engine.weight_version())
        except ValueError:
            if ticket.payload.get("collective"):
                # leaving a broadcast early would hang the learner: take the bytes, then
                # refuse (the engine's served version and fingerprint do not move)
                engine.update_weights_native(ticket.payload["update_info"],
                                             engine.weight_version(), discard=True)
            raise
        return engine.update_weights_native(ticket.payload["update_info"], ticket.version,
                                            verify=ticket.verify)

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------- learner side

class VllmNativeSender:
    name = "vllm_native"

    def __init__(self, cfg, world_size: int):
        require_cuda(cfg.backend)
        self.cfg, self.world_size = cfg, world_size
        self.bucket_bytes = cfg.bucket_mb * MIB
        self._gloo: BroadcastSender | None = None
        self._group = None                      # vLLM's PyNcclCommunicator (nccl)
        self._pending: list[tuple[str, torch.Tensor]] | None = None
        self._keep: list[torch.Tensor] = []      # ipc: tensors the handles point into
        self._gpu_uuid = ""
        if cfg.backend == "gloo":
            from engine.config import BroadcastSyncConfig

            self._gloo = BroadcastSender(BroadcastSyncConfig(
                backend="gloo", bucket_mb=cfg.bucket_mb, timeout_s=cfg.timeout_s), world_size)
            self._join = {"host": self._gloo.store.host, "port": self._gloo.store.port,
                          "world_size": world_size}
        elif cfg.backend == "nccl":
            host = _host()
            self._join = {"master_address": host, "master_port": _free_port(host),
                          "world_size": world_size, "packed": True,
                          "packed_buffer_size_bytes": self.bucket_bytes}
        else:
            self._gpu_uuid = str(torch.cuda.get_device_properties(
                torch.cuda.current_device()).uuid)
            self._join = {"packed": False}

    def join_info(self) -> dict:
        return dict(self._join)

    def connect(self) -> None:
        if self._gloo is not None:
            self._gloo.connect()
        elif self.cfg.backend == "nccl":
            from vllm.distributed.weight_transfer.nccl_common import trainer_init

            self._group = trainer_init(self._join, rank=0)

    def prepare(self, named_tensors: Sequence[tuple[str, torch.Tensor]], version: int,
                initial: bool = False) -> Ticket:
        layout = FlatLayout.of(named_tensors)
        if self._gloo is not None:
            self._gloo.prepare(named_tensors, version, initial)
            info = update_info(layout, offsets=[s.offset for s in layout.specs],
                               nbytes=layout.nbytes, bucket_bytes=self.bucket_bytes)
        elif self.cfg.backend == "nccl":
            self._pending = list(named_tensors)
            info = update_info(layout)
        else:
            from torch.multiprocessing.reductions import reduce_tensor

            # snapshots on this GPU (the learner may hold them anywhere), which the workers
            # map; kept alive until the next sync
            self._keep = [t.detach().to("cuda", copy=True).contiguous()
                          for _, t in named_tensors]
            torch.cuda.current_stream().synchronize()
            info = update_info(layout, ipc_handles=[{self._gpu_uuid: reduce_tensor(t)[1]}
                                                    for t in self._keep])
        collective = self.cfg.backend != "ipc"
        return Ticket(self.name, version, initial, layout,
                      {"update_info": info, "collective": collective})

    def transfer(self) -> None:
        if self._gloo is not None:
            self._gloo.transfer()
        elif self.cfg.backend == "nccl":
            from vllm.distributed.weight_transfer.packed_tensor import (
                packed_nccl_broadcast_producer,
            )

            pending, self._pending = self._pending, None
            packed_nccl_broadcast_producer(
                iterator=iter(pending), group=self._group, src=0,
                post_iter_func=lambda item: item[1].to("cuda").contiguous(),  # CPU learner too
                buffer_size_bytes=self.bucket_bytes)
            torch.cuda.current_stream().synchronize()

    def close(self) -> None:
        if self._gloo is not None:
            self._gloo.close()
        if self._group is not None:
            self._group.destroy()
            self._group = None
        self._keep = []

