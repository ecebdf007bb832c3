"""Config section of how the learner executes its update: device, precision, memory.

The update's math (the loss, the optimizer step) is the algorithm section's; this section
only chooses how it is computed, and every choice gives the same step up to float
rounding (bf16 aside, which trades precision for speed on purpose).

Whether a device exists is not checked here: this package is imported by the web process,
which validates configs for a cluster it is not part of. The learner refuses an absent
device where it would run (engine.learner.device.resolve_device).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from engine.config._base import _Section


class LearnerConfig(_Section):
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the learner trains. "auto" is CUDA when the learner's process sees a GPU
    (under Ray, the one Ray assigned to the learner's bundle) and the CPU otherwise;
    "cuda" refuses to start without one; "cpu" never uses a GPU."""
    precision: Literal["fp32", "bf16"] = "fp32"
    """Compute precision of forward and backward. "bf16" autocasts matmuls to bfloat16
    while parameters, gradients and optimizer state stay in the dtype of model.dtype
    (float32 master weights by default); logprobs and the loss are computed in float32
    either way."""
    gradient_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping
    them (Hugging Face gradient_checkpointing_enable): less memory, about a third more
    compute."""
    micro_batch_tokens: int = Field(default=0, ge=0, le=100_000_000)
    """Token budget (prompt + response tokens) of one forward/backward; each optimizer
    minibatch is split into micro-batches under it and their gradients accumulate, weighted
    by their share of response tokens, so the step equals one big batch's. A sequence longer
    than the budget gets a micro-batch of its own. 0 = no split."""
    reference: Literal["device", "cpu"] = "device"
    """Where the KL reference model (algorithm.kl_coef > 0) lives: "device" with the
    learner (sharded the same way when placement.learner_devices > 1), or "cpu": in host
    memory, one unsharded copy per learner process, its forward run on the CPU. "cpu"
    frees the device memory of a whole model at the cost of a CPU forward per step."""
    packing: bool = True
    """Pack prompt+response sequences end to end into dense rows (positions restart per
    sequence, attention never crosses sequences) instead of padding each to the longest,
    and compute a prompt once for the responses that share it (a group's; by a 4-D
    attention mask, on sdpa models without a sliding window). Same logprobs and loss as
    the padded layout, fewer wasted tokens."""
    routing_replay: bool = False
    """Mixture-of-Experts models: route the learner's forward through the experts the
    rollout recorded (rollout.record_routing) instead of the learner's own top-k; the
    routing weights come from the learner's router logits at those experts (engine.moe).
    Removes the logprob gap that a near-tied router choice opens between the engines."""
    compile: bool = False
    """torch.compile each decoder layer of the policy (inductor, dynamic shapes: packed
    batches change shape every step): the norms, rotary embedding, activation and
    residual passes between the matmuls fused into a few kernels. Costs a compile of
    ~10-15 s at the first update (and one more for a no-grad recompute). On CPU it sped
    the update 1.13-1.20x in the plain packed layout, and 1.01-1.05x once a group's
    prompt is computed once (packing), which leaves the matmuls ~70 % of the update
    (bench/learner_throughput.py --compile, both presets): measure before turning it
    on. Dense models with base_model.layers, one learner device; the same step up to
    float rounding."""
