"""Config section of the RL objective: how advantages are estimated, how the per-token loss
is clipped and aggregated, which experience reaches the learner, and the optimizer.

    algorithm = GrpoConfig (type = "grpo")        critic-free: advantages from the group
                                                  of completions of one prompt
              | PpoConfig  (type = "ppo")         a critic (value model) and GAE over the
                                                  response tokens; [algorithm.critic]

Names follow veRL where it has them (loss_agg_mode and its values, adv_estimator, the
overlong buffer); clip_eps_low / clip_eps_high are veRL's clip_ratio_low / _high.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationInfo, model_validator

from engine.config._base import FieldError, _choice, _Section

LossAggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                      "seq-mean-token-sum-norm"]
AdvEstimator = Literal["grpo", "rloo", "reinforce_pp"]


# --------------------------------------------------------------------------- overlong

class NoOverlongConfig(_Section):
    """Truncated completions (no EOS within rollout.max_new_tokens) train like any other."""
    type: Literal["none"] = "none"


class OverlongFilterConfig(_Section):
    """DAPO's overlong filtering: truncated completions still count in their group's
    advantages and in every metric, but their tokens are masked out of the loss."""
    type: Literal["filter"] = "filter"


class OverlongPenaltyConfig(_Section):
    """DAPO's soft overlong punishment (veRL's reward_model.overlong_buffer): a completion
    longer than rollout.max_new_tokens - buffer_len loses reward linearly in the excess,
    up to penalty_factor at the full budget. The shaped reward drives advantages and
    dynamic sampling; reward/* metrics stay the verifier's."""
    type: Literal["penalty"] = "penalty"
    buffer_len: int = Field(default=16, ge=1, le=1_000_000)
    """Tokens before the budget where the penalty starts (veRL's overlong_buffer.len); must
    be below rollout.max_new_tokens."""
    penalty_factor: float = Field(default=1.0, gt=0.0, le=100.0)
    """Penalty at the full budget (veRL's overlong_buffer.penalty_factor)."""


OverlongConfig = _choice(NoOverlongConfig, OverlongFilterConfig, OverlongPenaltyConfig)


# --------------------------------------------------------------------------- algorithms

class _PolicyGradient(_Section):
    """What every policy-gradient algorithm shares: the clipped surrogate, its aggregation,
    the experience filters and the optimizer."""

    group_size: int = Field(default=8, ge=2, le=64)
    """Completions sampled per prompt (the group an estimator compares them within)."""
    lr: float = Field(default=1e-4, gt=0.0, le=1.0)
    """AdamW learning rate of the policy."""
    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0)
    """AdamW decoupled weight decay."""
    clip_eps: float = Field(default=0.2, gt=0.0, le=1.0)
    """PPO ratio clip: ratios are clipped to [1 - clip_eps, 1 + clip_eps] unless
    clip_eps_low / clip_eps_high set one side."""
    clip_eps_low: float | None = Field(default=None, gt=0.0, le=1.0)
    """Lower side of the ratio clip, 1 - clip_eps_low (veRL's clip_ratio_low); unset =
    clip_eps."""
    clip_eps_high: float | None = Field(default=None, gt=0.0, le=10.0)
    """Upper side of the ratio clip, 1 + clip_eps_high (veRL's clip_ratio_high); unset =
    clip_eps. DAPO's clip-higher raises it (0.28 with clip_eps_low 0.2) so unlikely tokens
    with a positive advantage can grow, against entropy collapse."""
    kl_coef: float = Field(default=0.0, ge=0.0, le=10.0)
    """Weight of the k3 KL to the frozen reference (the warm start), in the loss. 0 skips
    the reference."""
    tis_cap: float = Field(default=2.0, ge=1.0, le=100.0)
    """Truncated importance sampling cap on exp(learner - behaviour logprob) per token."""
    loss_agg_mode: LossAggMode = "token-mean"
    """How per-token losses of a minibatch become one number (veRL's names): "token-mean"
    averages every response token (DAPO); "seq-mean-token-mean" averages each sequence's
    tokens, then the sequences (the GRPO paper); "seq-mean-token-sum" sums each sequence's
    tokens, then averages the sequences; "seq-mean-token-sum-norm" is that divided by
    rollout.max_new_tokens, a constant (Dr. GRPO, with normalize_std = false)."""
    epochs: int = Field(default=1, ge=1, le=16)
    """Passes over each step's batch."""
    minibatches: int = Field(default=2, ge=1, le=64)
    """Optimizer steps per epoch; the batch is split into this many minibatches."""
    max_grad_norm: float = Field(default=1.0, gt=0.0, le=1000.0)
    """Global gradient-norm clip."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling (veRL's filter_groups): drop every group whose rewards all
    agree (it has no learning signal) and generate more until the step's batch is full.
    samples/resampled counts the samples it drew in place of dropped ones."""
    max_resample_rounds: int = Field(default=4, ge=1, le=100)
    """Bound on dynamic sampling's extra generation (veRL's max_num_gen_batches): one step
    drops at most max_resample_rounds x rollout.prompts_per_step groups. Past it the step
    trains on the groups it has, a smaller batch (with a warning), and fails only when it
    has none."""
    overlong: OverlongConfig = NoOverlongConfig()
    """Truncated completions: "none", "filter" (masked out of the loss) or "penalty"
    (DAPO's soft length penalty on the reward)."""

    @property
    def clip_low(self) -> float:
        return self.clip_eps if self.clip_eps_low is None else self.clip_eps_low

    @property
    def clip_high(self) -> float:
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high


class GrpoConfig(_PolicyGradient):
    """Critic-free: each completion's advantage comes from the rewards of its group (or,
    for reinforce_pp, of the whole batch)."""

    type: Literal["grpo"] = "grpo"
    adv_estimator: AdvEstimator = "grpo"
    """How rewards become advantages (one per completion, shared by its tokens): "grpo"
    r - mean(group) [/ std(group)]; "rloo" r - mean of the other completions of the group
    (leave-one-out); "reinforce_pp" (veRL's reinforce_plus_plus, outcome reward, gamma 1)
    the reward whitened over every response token of the step's batch, no groups."""
    normalize_std: bool = True
    """adv_estimator "grpo": divide by the group std (GRPO); False keeps mean-centering
    only (Dr. GRPO). veRL's norm_adv_by_std_in_grpo."""

    @model_validator(mode="after")
    def _std_is_grpos(self) -> GrpoConfig:
        # Only the non-default is refused: a dumped config spells out normalize_std = true.
        if not self.normalize_std and self.adv_estimator != "grpo":
            raise FieldError("algorithm.normalize_std",
                             f'algorithm.normalize_std=false applies to adv_estimator = '
                             f'"grpo" only, and adv_estimator is "{self.adv_estimator}"; '
                             f'remove normalize_std')
        return self


class CriticConfig(_Section):
    """PPO's value model: the policy's architecture with a scalar head on every token
    (transformers' *ForTokenClassification, num_labels = 1), trained by its own AdamW."""

    path: str | None = None
    """A local Hugging Face directory to start the critic from (a critic saved by a PPO
    checkpoint's critic/, or any model of the policy's tokenizer); unset = the policy's
    own weights with a fresh, zero head. A fork of a run without a critic (GRPO) to PPO
    needs it."""
    lr: float = Field(default=1e-4, gt=0.0, le=1.0)
    """AdamW learning rate of the critic (veRL's critic.optim.lr)."""
    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0)
    """AdamW decoupled weight decay of the critic."""
    max_grad_norm: float = Field(default=1.0, gt=0.0, le=1000.0)
    """Global gradient-norm clip of the critic's steps."""

    @model_validator(mode="after")
    def _path_holds_a_model(self, info: ValidationInfo) -> CriticConfig:
        if self.path is None or not (info.context or {}).get("check_files", True):
            return self
        path = Path(self.path).expanduser()
        if not (path / "config.json").is_file():
            raise FieldError("algorithm.critic.path",
                             f"algorithm.critic.path={path} holds no config.json; point it at "
                             f"a local Hugging Face model directory (a PPO checkpoint's "
                             f"critic/), or unset it to start the critic from the policy")
        if not any(next(path.glob(g), None) for g in ("*.safetensors", "pytorch_model*.bin")):
            raise FieldError("algorithm.critic.path",
                             f"algorithm.critic.path={path} holds no weights (*.safetensors "
                             f"or pytorch_model*.bin); save the critic there with "
                             f"save_pretrained")
        return self


class PpoConfig(_PolicyGradient):
    """PPO with a critic: per-token advantages by GAE from the critic's values.

    Token-level rewards are the sequence's (learning) reward on its last response token
    and 0 elsewhere; algorithm.kl_coef stays a loss term as in GRPO (no KL in the reward).
    Every completion ends its episode at its last token (truncated ones too: no bootstrap
    beyond the budget). Completions are still drawn group_size per prompt; the groups only
    matter to dynamic sampling."""

    type: Literal["ppo"] = "ppo"
    gamma: float = Field(default=1.0, ge=0.0, le=1.0)
    """Discount per response token (veRL's algorithm.gamma)."""
    lam: float = Field(default=0.95, ge=0.0, le=1.0)
    """GAE's lambda (veRL's algorithm.lam): 1 = Monte-Carlo returns minus values, 0 = one-step
    TD errors."""
    value_clip_eps: float = Field(default=0.5, gt=0.0, le=100.0)
    """Value clip (veRL's critic.cliprange_value): the loss takes the worse of the new value
    and the old value moved at most this far toward it."""
    whiten_advantages: bool = True
    """Whiten the GAE advantages over every response token of the step's batch (mean 0,
    std 1), as veRL and OpenRLHF do."""
    critic: CriticConfig = CriticConfig()
    """The value model: where it starts from and its optimizer."""


AlgorithmConfig = _choice(GrpoConfig, PpoConfig)
