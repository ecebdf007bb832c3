"""Config sections of where rollout and learner run."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from engine.config._base import _choice, _Section

# --------------------------------------------------------------------------- placement

BundleStrategy = Literal["PACK", "SPREAD", "STRICT_PACK"]
MAX_ROLLOUT_WORKERS = 1024   # at launch and live (engine.controls: set_rollout_workers)


class _PlacementCommon(_Section):
    strategy: BundleStrategy = "PACK"
    """Ray placement-group strategy for the bundles: PACK (as few nodes as possible),
    SPREAD (across nodes where possible) or STRICT_PACK (all on one node, or refuse)."""
    threads_per_actor: int = Field(default=1, ge=1, le=256)
    """torch CPU threads in each Ray actor. On a CPU box give each actor its own cores:
    more threads than cores makes overlapping actors slow each other down."""
    ready_timeout_s: float = Field(default=60.0, gt=0.0, le=3600.0)
    """Longest wait for Ray to grant the placement group before the run fails (a
    placement that cannot fit the cluster is refused at once, before this wait)."""
    max_worker_replacements: int = Field(default=3, ge=0, le=1000)
    """On Ray: how many rollout workers the run replaces (one that dies is restarted on
    its bundle and given the current weights; the prompts it held are dropped, counted)
    before the next loss fails the run. 0: the first lost worker fails it."""
    health_check_s: float = Field(default=120.0, gt=0.0, le=86_400.0)
    """On Ray: a rollout worker that does not answer the loop's per-step telemetry call
    (which runs beside generation, so a busy worker answers at once) within this many
    seconds is taken for hung: killed and replaced as a dead one."""
    critic_devices: int = Field(default=0, ge=0, le=1024)
    """PPO's critic: 0 = with the learner, on its devices, in turn with it (the default);
    1 = a critic actor on a bundle of its own, which trains its values while the learner
    trains the policy (OpenRLHF's critic_num_gpus_per_node; veRL's critic resource pool).
    Needs algorithm.type = "ppo" and a Ray placement; the critic is not sharded, so one
    device is all it uses."""


class ColocatedPlacementConfig(_PlacementCommon):
    """Rollout and learner time-share the same devices."""

    type: Literal["colocated"] = "colocated"
    devices: int = Field(default=1, ge=1, le=1024)
    """Logical devices shared by rollout and learner, which take turns on them. On Ray,
    each device is a bundle with one rollout worker; the learner shares device 0."""
    ray: bool = False
    """Place the rollout workers and the learner as Ray actors that share each device's
    bundle (True), or run both in the driver's process with no Ray at all (False, the
    default: fastest start; async policies then keep their schedule without overlap,
    unless overlap_threads is set)."""
    overlap_threads: int = Field(default=0, ge=0, le=256)
    """In the driver's process (ray = false) with an overlapping async policy
    (one_step_off, fully_async): run the rollout worker on a thread of its own with this
    many torch CPU threads, so the next batch is generated while the learner updates
    (how the two share the cores: overlap_share). 0 (the default): the worker runs in
    the driver's thread and each phase has every core."""
    overlap_share: Literal["idle", "split"] = "idle"
    """How the overlapped rollout thread (overlap_threads) shares the cores with the
    learner. "idle" (the default): the learner keeps every core and the rollout thread
    runs at the lowest CPU priority (nice 19, Linux), on the cycles the update leaves idle
    (its Python, its single-threaded small kernels, its waits); "split": the learner
    keeps all but overlap_threads cores and both run at the same priority. On this
    2-core box's demo recipe "idle" overlapped made the step faster than sync's, "split"
    slower (bench/vs_trl.py prints both)."""


class DisaggregatedPlacementConfig(_PlacementCommon):
    """Rollout workers and the learner on separate bundles, as Ray actors."""

    type: Literal["disaggregated"] = "disaggregated"
    rollout_workers: int = Field(default=1, ge=1, le=MAX_ROLLOUT_WORKERS)
    """Data-parallel rollout workers, each a Ray actor with its own bundle."""
    devices_per_worker: int = Field(default=1, ge=1, le=64)
    """Devices (GPUs; logical GPUs on a CPU box) in each rollout worker's bundle."""
    learner_devices: int = Field(default=1, ge=1, le=1024)
    """Devices in the learner's bundle."""


PlacementConfig = _choice(ColocatedPlacementConfig, DisaggregatedPlacementConfig)
