"""Config sections of how new weights reach the rollout engines."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from engine.config._base import _choice, _Section

# --------------------------------------------------------------------------- weight sync

DELTA_TRANSPORTS = ("shm", "object_store", "broadcast")
# One process group for the learner and every rollout worker, its world fixed when the run
# starts: no worker can join it later (a replacement, a live resize).
COLLECTIVE_TRANSPORTS = ("broadcast", "vllm_native")


class _SyncSection(_Section):
    """What every transport shares: how often a sync is verified and whether only the
    changed bytes travel."""

    verify_every: int = Field(default=1, ge=1, le=1_000_000)
    """Verify every Nth sync: both ends fingerprint the weights (learner: what it sent;
    each rollout engine: what it serves) and the sync is "matched" only when they agree.
    1 verifies every sync; N > 1 skips the fingerprints of the others, which then count as
    matched on their versions alone (weight_sync/verified = 0). A run's first sync is
    always verified."""
    delta: bool = False
    """Send only what changed: the XOR of the new weights' bytes against the version the
    rollout workers serve, compressed with zstd; a worker that is not at that version (a
    version gap, a fresh worker) gets the full weights. Byte transports only ("shm",
    "object_store", "broadcast")."""
    timeout_s: float = Field(default=300.0, gt=0.0, le=86400.0)
    """Longest a rollout worker may spend loading one sync's weights (counted from when it
    starts: a sync queued behind a generation call waits its turn first). On Ray a worker
    still loading after this long is abandoned: killed and replaced like a dead one
    (placement.max_worker_replacements), and the run goes on. Collective transports
    ("broadcast", "vllm_native") also bound each rank's wait for the others by it."""

    @model_validator(mode="after")
    def _delta_needs_a_byte_transport(self):
        if self.delta and self.type not in DELTA_TRANSPORTS:
            raise ValueError(
                f'weight_sync.delta = true sends an XOR of the weight bytes, which '
                f'weight_sync.type = "{self.type}" does not move as bytes; use type = '
                f'"shm", "object_store" or "broadcast", or set delta = false')
        return self

class InPlaceSyncConfig(_SyncSection):
    """Copy the learner's tensors into the rollout engine's own (colocated, one process).
    As with every transport, the engine then fingerprints what it serves and reports it."""

    type: Literal["in_place"] = "in_place"


class ShmSyncConfig(_SyncSection):
    """Same node, across processes: the learner packs its tensors into one flat buffer in a
    shared-memory file; each rollout worker maps it without copying and loads from it."""

    type: Literal["shm"] = "shm"
    directory: str = Field(default="/dev/shm", min_length=1, max_length=4096)
    """Directory of the buffer file: a tmpfs (RAM) that the learner and every rollout worker
    of the node can open; a disk directory works but is slow."""


class ObjectStoreSyncConfig(_SyncSection):
    """Through the Ray object store: one ``ray.put`` of the packed tensors per sync, read
    zero-copy by workers on the learner's node and fetched by Ray on other nodes."""

    type: Literal["object_store"] = "object_store"


class BroadcastSyncConfig(_SyncSection):
    """torch.distributed broadcast from the learner (rank 0) to every rollout worker, in
    large contiguous buckets. Its own process group, so vLLM's default group is untouched."""

    type: Literal["broadcast"] = "broadcast"
    backend: Literal["gloo", "nccl"] = "gloo"
    """Collective backend: "gloo" moves CPU tensors; "nccl" moves CUDA tensors (GPUs only)."""
    bucket_mb: int = Field(default=32, ge=1, le=4096)
    """Size of one broadcast bucket in MiB; parameters are packed back to back and a tensor
    larger than a bucket spans several."""
    double_buffer: bool = True
    """Pack bucket i+1 into a second buffer while bucket i is on the wire."""


class CheckpointFileSyncConfig(_SyncSection):
    """The slow fallback that works wherever a directory is shared: the learner writes a
    safetensors file per version, the workers load it."""

    type: Literal["checkpoint"] = "checkpoint"
    directory: str | None = Field(default=None, min_length=1, max_length=4096)
    """Directory visible to the learner and every rollout worker (a shared filesystem across
    nodes). None makes a temporary directory, which only works on one node."""
    keep_last: int = Field(default=2, ge=1, le=100)
    """Version files kept on disk; older ones are deleted when a new version is written."""


class CudaIpcSyncConfig(_SyncSection):
    """Same GPU node: workers open the learner's CUDA tensors through IPC handles (no copy
    through host memory). Needs CUDA; on CPU it is refused with the fix."""

    type: Literal["cuda_ipc"] = "cuda_ipc"


class VllmNativeSyncConfig(_SyncSection):
    """vLLM's own weight-transfer API (rollout.type = "vllm" only): each worker's vLLM is
    started with a weight-transfer engine and every sync runs vLLM's lifecycle
    (start_weight_update, update_weights, finish_weight_update; vLLM's layerwise reload
    re-runs its own post-load processing). "nccl" and "ipc" are vLLM's CUDA engines; "gloo"
    is rlplane's engine registered with vLLM, the same lifecycle on CPU."""

    type: Literal["vllm_native"] = "vllm_native"
    backend: Literal["gloo", "nccl", "ipc"] = "gloo"
    """"gloo": CPU tensors over a gloo group (any machine). "nccl": vLLM's packed NCCL
    broadcast (GPUs, any node). "ipc": vLLM's CUDA IPC engine (learner and rollout on the
    same GPU)."""
    bucket_mb: int = Field(default=32, ge=1, le=4096)
    """Bytes per broadcast bucket (gloo) or packed buffer (nccl), in MiB."""


WeightSyncConfig = _choice(InPlaceSyncConfig, ShmSyncConfig, ObjectStoreSyncConfig,
                           BroadcastSyncConfig, CheckpointFileSyncConfig, CudaIpcSyncConfig,
                           VllmNativeSyncConfig)
