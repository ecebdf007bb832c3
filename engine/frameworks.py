"""The frameworks an external run can be trained with, and what their metric names mean in
rlplane's vocabulary. A client sends the framework's own names; ingest maps them:

    canonical_metrics("verl", {"timing_s/gen": 41.0, "actor/pg_loss": 0.1, "perf/mfu": 0.3})
    # -> {M.TIME_ROLLOUT_S: 41.0, M.LEARNER_LOSS: 0.1, "perf/mfu": 0.3}
    their_names("verl", M.TIME_ROLLOUT_S)     # -> ["timing_s/gen"]: what the alerts page asks for

A name no table maps is kept as it is (and charted under it). A mapping is here only where
the framework's number means what rlplane's does, in the same unit: each table cites the
file and version it was read from, so a renamed metric upstream is found by reading one
place again. The framework ids and labels are ExternalRunConfig's (engine.config), so the
list is written once; otherwise standard library only.
"""

from __future__ import annotations

from collections.abc import Mapping

from engine import metrics as M
from engine.config import FRAMEWORK_LABELS, FRAMEWORKS, NATIVE

__all__ = ["FRAMEWORKS", "FRAMEWORK_LABELS", "MAPPINGS", "NATIVE", "canonical_metrics",
           "canonical_name", "their_names"]

# TRL 1.16.0 (trl/trainer/grpo_trainer.py, GRPOTrainer._metrics and .log) and
# transformers 5.19.0 (Trainer.log: loss, grad_norm, learning_rate). All per logging step.
TRL = {
    "reward": M.REWARD_MEAN,                  # nanmean of the weighted sum of reward funcs
    "reward_std": M.REWARD_STD,               # nanstd over all the step's rewards
    # per-group std with scale_rewards "group" (the default) or "none"; with "batch" TRL
    # tests the whole batch's std, so it reads 1 only when every group is flat
    "frac_reward_zero_std": M.SAMPLES_ZERO_STD_GROUP_FRAC,
    "completions/mean_length": M.RESPONSE_LENGTH_MEAN,
    "completions/min_length": M.RESPONSE_LENGTH_MIN,
    "completions/max_length": M.RESPONSE_LENGTH_MAX,
    "completions/clipped_ratio": M.RESPONSE_TRUNCATED_FRAC,  # last token not EOS: cut
    "kl": M.LEARNER_KL_REF,                   # k3: exp(ref - pi) - (ref - pi) - 1, beta != 0
    "entropy": M.LEARNER_ENTROPY,
    "clip_ratio/region_mean": M.LEARNER_CLIP_FRAC,   # low or high clipped, token mean
    # |old_per_token_logps - sampling_per_token_logps| over completion tokens (vLLM IS on)
    "sampling/sampling_logp_difference/mean": M.LOGPROB_GAP_MEAN,
    "sampling/sampling_logp_difference/max": M.LOGPROB_GAP_MAX,
    "loss": M.LEARNER_LOSS,                   # Trainer's; includes beta * kl, as ours does
    "grad_norm": M.LEARNER_GRAD_NORM,
    "learning_rate": M.LEARNER_LR,
    "eval_reward": M.EVAL_REWARD_MEAN,        # GRPOTrainer.log prefixes eval metrics eval_
    # GRPOTrainer.training_step's wall time summed over the accumulation steps: generation
    # (in _prepare_inputs), scoring, forward and backward; the optimizer step is not in it
    # (a few ms on the sizes it is worth watching at)
    "step_time": M.TIME_STEP_S,
}
# Not mapped: sampling/importance_sampling_ratio/{min,mean,max} (the truncated IS weight
# itself; rlplane reports only the share clipped, tis/clip_frac), clip_ratio/low_*,
# high_* (one side each), rewards/<func>/mean (per reward function), num_tokens.

# veRL 0.8.0.dev, volcengine/verl@b178a3cd (2026-01-29): verl/trainer/ppo/metric_utils.py
# (compute_data_metrics, compute_timing_metrics), verl/trainer/ppo/ray_trainer.py (fit:
# marked_timer names, actor/entropy), verl/workers/actor/dp_actor.py, verl/trainer/ppo/
# core_algos.py, verl/workers/critic/dp_critic.py, verl/workers/fsdp_workers.py (lr),
# verl/utils/debug/metrics.py, verl/trainer/ppo/rollout_corr_helper.py.
# Already rlplane's names, with rlplane's meaning, so kept as they are (and not spelled
# here): response_length/{mean,min,max} (tokens), critic/grad_norm, critic/lr.
VERL = {
    "critic/score/mean": M.REWARD_MEAN,       # token_level_scores summed: the reward fn's
    "response_length/clip_ratio": M.RESPONSE_TRUNCATED_FRAC,  # share == max_response_length
    "timing_s/step": M.TIME_STEP_S,           # timing_s/*: seconds of this step
    "timing_s/gen": M.TIME_ROLLOUT_S,
    "timing_s/reward": M.TIME_REWARD_S,
    "timing_s/update_actor": M.TIME_LEARNER_S,   # old_log_prob and ref are timed apart
    "timing_s/update_critic": M.TIME_CRITIC_S,
    "timing_s/update_weights": M.TIME_WEIGHT_SYNC_S,
    "actor/pg_loss": M.LEARNER_LOSS,
    "actor/grad_norm": M.LEARNER_GRAD_NORM,
    "actor/entropy": M.LEARNER_ENTROPY,
    "actor/pg_clipfrac": M.LEARNER_CLIP_FRAC,
    "actor/kl_loss": M.LEARNER_KL_REF,        # kl_loss_type, low_var_kl (k3) by default
    "actor/lr": M.LEARNER_LR,
    "critic/vf_loss": M.CRITIC_VALUE_LOSS,
    "critic/vf_clipfrac": M.CRITIC_VALUE_CLIP_FRAC,
    "critic/vf_explained_var": M.CRITIC_EXPLAINED_VARIANCE,
    "critic/values/mean": M.CRITIC_VALUE_MEAN,
    "critic/returns/mean": M.CRITIC_RETURN_MEAN,
    # |exp(actor logp) - exp(rollout logp)|: probabilities, not nats, hence prob_gap/*
    "training/rollout_probs_diff_mean": M.PROB_GAP_MEAN,
    "training/rollout_probs_diff_max": M.PROB_GAP_MAX,
    # r - log r - 1, r = pi_old / pi_rollout: our learner's k3 of behaviour vs learner
    "rollout_corr/k3_kl": M.LOGPROB_GAP_K3,
}
# Not mapped: critic/rewards/* (score minus the in-reward KL penalty), perf/time_per_step
# (the same number as timing_s/step), perf/throughput (all tokens per GPU-second),
# timing_s/old_log_prob, ref, adv (no phase of ours alone), rollout_corr/kl (signed mean,
# not the absolute gap), val-core/<source>/... (named after the data source).

# OpenRLHF 0.11.0, OpenRLHF/OpenRLHF@3c3be623 (2026-08-13): openrlhf/utils/logging_utils.py
# (TensorboardLogger.log_train writes train/<key>; WandbLogger the same names),
# openrlhf/trainer/ppo_trainer.py (_compute_rollout_stats, timing/*), openrlhf/trainer/ray/
# ppo_actor.py and ppo_critic.py (status keys), openrlhf/models/loss.py (clip_ratio).
OPENRLHF = {
    "train/rollout/reward_mean": M.REWARD_MEAN,
    "train/rollout/reward_std": M.REWARD_STD,
    "train/rollout/response_length_mean": M.RESPONSE_LENGTH_MEAN,
    "train/rollout/truncated_rate": M.RESPONSE_TRUNCATED_FRAC,
    "train/timing/step_total": M.TIME_STEP_S,     # sum of the step's timing/* (seconds)
    "train/timing/generation": M.TIME_ROLLOUT_S,
    "train/timing/ppo_train": M.TIME_LEARNER_S,   # actor + critic fit (parallel, one wall)
    "train/timing/broadcast": M.TIME_WEIGHT_SYNC_S,
    "train/policy_loss": M.LEARNER_LOSS,
    "train/actor_grad_norm": M.LEARNER_GRAD_NORM,
    "train/actor_lr": M.LEARNER_LR,
    "train/ppo_clip_ratio": M.LEARNER_CLIP_FRAC,  # share of tokens where surr2 < surr1
    "train/kl": M.LEARNER_KL_REF,                 # algo.kl.estimator (k1/k2/k3) to ref
    "train/critic_loss": M.CRITIC_VALUE_LOSS,
    "train/critic_grad_norm": M.CRITIC_GRAD_NORM,
    "train/critic_lr": M.CRITIC_LR,
    "train/values": M.CRITIC_VALUE_MEAN,
}
# Not mapped: train/reward (per-sample mean, the same as rollout/reward_mean but after
# dynamic batching), train/return (summed token rewards, not a GAE return), train/vllm_kl
# (signed mean rollout - old logprob, not the absolute gap), train/timing/make_experience
# (reward, reference and critic forward together), train/dynamic_filtering_pass_rate.

# prime-rl 0.8.0, PrimeIntellect-ai/prime-rl@559b4477 (2026-08-21): src/prime_rl/trainer/
# rl/train.py (optim/*, loss/mean, entropy/all/mean, mismatch_kl/all/mean), trainer/rl/
# loss.py (mismatch_kl), orchestrator/orchestrator.py (off_policy/*).
PRIME_RL = {
    "loss/mean": M.LEARNER_LOSS,
    "entropy/all/mean": M.LEARNER_ENTROPY,
    "optim/grad_norm": M.LEARNER_GRAD_NORM,
    "optim/lr": M.LEARNER_LR,
    # r - log r - 1, r = exp(trainer - inference logprob): the same k3 as ours
    "mismatch_kl/all/mean": M.LOGPROB_GAP_K3,
    "off_policy/mean": M.STALENESS_MEAN,      # trained-on version - generating version
    "off_policy/max": M.STALENESS_MAX,
}
# Not mapped: the orchestrator's rewards and lengths (train/agg/<subset>/<agent>/reward/
# mean: named after the agent, no fixed name to map); time/step (the trainer and the
# orchestrator both log it, meaning different steps); off_policy/dropped (per step, ours
# is a running total); time/broadcast_weights (the trainer's side of the sync only).

MAPPINGS: dict[str, dict[str, str]] = {
    "trl": TRL, "verl": VERL, "openrlhf": OPENRLHF, "prime-rl": PRIME_RL,
    "script": {},       # a script logs what it likes; rlplane's names are taken as they are
}

# Logger rewrites of a framework's names that the table still recognises: transformers'
# TensorBoard and W&B callbacks log TRL's "reward" as "train/reward" and "eval_reward" as
# "eval/reward" (integration_utils.rewrite_logs). (logged prefix, the table's prefix)
PREFIX_REWRITES: dict[str, tuple[tuple[str, str], ...]] = {
    "trl": (("train/", ""), ("eval/", "eval_")),
}


def _table(framework: str) -> dict[str, str]:
    if framework == NATIVE:
        return {}           # rlplane's own engine reports canonical names
    if framework not in MAPPINGS:
        raise ValueError(f"unknown framework {framework!r}: one of {', '.join(FRAMEWORKS)}")
    return MAPPINGS[framework]


def canonical_name(framework: str, name: str) -> str:
    """The canonical name ``name`` of ``framework`` stands for, or ``name`` itself."""
    table = _table(framework)
    if name in table:
        return table[name]
    for logged, plain in PREFIX_REWRITES.get(framework, ()):
        if name.startswith(logged) and plain + name[len(logged):] in table:
            return table[plain + name[len(logged):]]
    return name


def canonical_metrics(framework: str, values: Mapping[str, object]) -> dict[str, object]:
    """``values`` under rlplane's names where the framework's table maps them; any other
    name is kept as it is. A mapped name wins over the same canonical name sent as is.
    The values themselves are not touched: a table maps only same-unit metrics."""
    _table(framework)                                   # an unknown framework raises
    out: dict[str, object] = {}
    mapped: dict[str, object] = {}
    for name, value in values.items():
        canonical = canonical_name(framework, name)
        (out if canonical == name else mapped)[canonical] = value
    out.update(mapped)
    return out


def their_names(framework: str, canonical: str) -> list[str]:
    """What ``framework`` would have to log to feed the canonical metric: its own names for
    it, or, where it has none, the canonical name itself (any name is kept as it is)."""
    names = [theirs for theirs, ours in _table(framework).items() if ours == canonical]
    return names or [canonical]
