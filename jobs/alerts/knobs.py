"""Runbook levers for an external run: the framework's own knob names where we know them,
plain words where we don't. An external run has no RunConfig, so a runbook must never tell
its user to set an rlplane field (jobs/alerts/levers.py reads a RunConfig).

    knob("trl", "kl_coef")      -> "beta"
    lever("verl", "kl_coef", "the KL penalty to the reference")
        -> "the KL penalty to the reference (actor_rollout_ref.actor.kl_loss_coef)"
    lever("script", "kl_coef", "the KL penalty to the reference")
        -> "the KL penalty to the reference"

Names as each framework's config spells them: TRL's GRPOConfig fields, veRL's Hydra
keys (verl/trainer/config/ppo_trainer.yaml), OpenRLHF's command-line flags
(openrlhf/cli/train_ppo_ray.py), prime-rl's orchestrator config (max_async_level,
sampling.*, rollouts_per_example).
"""

from __future__ import annotations

KNOBS: dict[str, dict[str, str]] = {
    "trl": {"kl_coef": "beta", "temperature": "temperature",
            "group_size": "num_generations", "max_new_tokens": "max_completion_length",
            "is_cap": "vllm_importance_sampling_cap"},
    "verl": {"kl_coef": "actor_rollout_ref.actor.kl_loss_coef",
             "temperature": "actor_rollout_ref.rollout.temperature",
             "group_size": "actor_rollout_ref.rollout.n",
             "max_new_tokens": "data.max_response_length",
             "filter_groups": "algorithm.filter_groups.enable"},
    "openrlhf": {"kl_coef": "--init_kl_coef", "temperature": "--temperature",
                 "group_size": "--n_samples_per_prompt", "max_new_tokens": "--generate_max_len",
                 "filter_groups": "--dynamic_filtering"},
    "prime-rl": {"temperature": "sampling.temperature", "group_size": "rollouts_per_example",
                 "max_new_tokens": "sampling.max_tokens", "staleness": "max_async_level"},
}
LEVERS = ("kl_coef", "temperature", "group_size", "max_new_tokens", "is_cap",
          "filter_groups", "staleness")


def knob(framework: str, lever: str) -> str | None:
    """The framework's name for ``lever`` (one of LEVERS), or None if we know none."""
    if lever not in LEVERS:
        raise ValueError(f"unknown lever {lever!r}; one of {LEVERS}")
    return KNOBS.get(framework, {}).get(lever)


def lever(framework: str, name: str, words: str) -> str:
    """``words``, followed by the framework's knob for ``name`` in parentheses if known."""
    theirs = knob(framework, name)
    return f"{words} ({theirs})" if theirs else words
