"""Policy-gradient pieces as pure tensor functions (unit-tested on hand-made numbers).

Shapes: B sequences, R response tokens; ``mask`` (B, R) is 1 on real response tokens.

    advantages(estimator, rewards, lengths, K)    (B,) one per completion, for its tokens
    gae(token_rewards, values, mask, gamma, lam)  (B, R) PPO's per-token advantages, returns
    clipped_value_loss(v, v_old, returns, eps)    (B, R) PPO's critic loss per token
    clipped_surrogate(new, old, A, low, high)     (B, R) min(ratio A, clip(ratio) A)
    token_weights(mask, loss_agg_mode)            (B, R) w with loss = sum(w * per_token)
"""

from __future__ import annotations

import torch

# --------------------------------------------------------------------------- advantages


def group_advantages(rewards: torch.Tensor, group_size: int, normalize_std: bool,
                     eps: float = 1e-6) -> torch.Tensor:
    """(B,) rewards ordered group by group -> (B,) advantages r - mean(group) [/ std]."""
    r = rewards.view(-1, group_size)                                  # (G, K)
    adv = r - r.mean(dim=1, keepdim=True)
    if normalize_std:
        adv = adv / (r.std(dim=1, keepdim=True, unbiased=False) + eps)
    return adv.reshape(-1)


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """(B,) -> (B,) leave-one-out: r_i - mean of the other K - 1 rewards of its group,
    i.e. K / (K - 1) x (r_i - mean(group)) (Ahmadian et al. 2024)."""
    r = rewards.view(-1, group_size)                                  # (G, K)
    others = (r.sum(dim=1, keepdim=True) - r) / (group_size - 1)
    return (r - others).reshape(-1)


def reinforce_pp_advantages(rewards: torch.Tensor, lengths: torch.Tensor,
                            eps: float = 1e-8) -> torch.Tensor:
    """REINFORCE++ with an outcome reward and gamma = 1: every response token's return is
    its sequence's reward, and returns are whitened over all response tokens of the batch
    (no groups): mean and unbiased variance weighted by each sequence's token count.
    (B,) rewards, (B,) lengths -> (B,) advantages."""
    w = lengths.to(rewards.dtype)
    n = w.sum()
    mean = (w * rewards).sum() / n
    var = (w * (rewards - mean) ** 2).sum() / (n - 1).clamp(min=1)
    return (rewards - mean) * torch.rsqrt(var + eps)


def advantages(estimator: str, rewards: torch.Tensor, lengths: torch.Tensor, group_size: int,
               normalize_std: bool = True) -> torch.Tensor:
    """(B,) advantages of ``algorithm.adv_estimator`` for rewards ordered group by group."""
    if estimator == "grpo":
        return group_advantages(rewards, group_size, normalize_std)
    if estimator == "rloo":
        return rloo_advantages(rewards, group_size)
    if estimator == "reinforce_pp":
        return reinforce_pp_advantages(rewards, lengths)
    raise ValueError(f"unknown advantage estimator {estimator!r}")


def terminal_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) sequence rewards -> (B, R) token-level rewards: each on its sequence's last
    sampled token (mask 1; a trajectory's response may end on an observation), 0
    elsewhere (an outcome reward; PPO's critic spreads it back)."""
    R = mask.shape[-1]
    cols = torch.arange(R, device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, cols, -1).max(dim=-1).values.clamp(min=0)   # (B,)
    out = torch.zeros_like(mask)
    out[torch.arange(len(rewards)), last] = rewards.to(out.dtype) * (mask.sum(dim=-1) > 0)
    return out


def gae(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
        lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over response tokens (Schulman et al. 2016):

        delta_t = r_t + gamma * V_{t+1} - V_t          V_{t+1} = 0 past the last token
        A_t     = delta_t + gamma * lam * A_{t+1}       A = 0 past the last token
        returns = A + V                                 (the critic's targets)

    Every sequence ends its episode at its last sampled token (the terminal step: no
    value beyond it). Tokens off the mask are no steps: a trajectory's observations
    between two turns are passed over, so t+1 is the next sampled token (veRL's GAE
    does the same). (B, R) rewards, values, mask -> (B, R) advantages, returns; 0 off
    the mask."""
    values = values * mask
    B, R = mask.shape
    adv = torch.zeros_like(values)
    running = torch.zeros(B, dtype=values.dtype, device=values.device)
    next_value = torch.zeros_like(running)
    for t in reversed(range(R)):
        m = mask[:, t]
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        # Off the mask (pad after the end, an observation) nothing changes: the next
        # sampled token's value and advantage carry over it, unchanged.
        running = (delta + gamma * lam * running) * m + running * (1 - m)
        next_value = values[:, t] * m + next_value * (1 - m)
        adv[:, t] = running * m
    return adv, (adv + values) * mask


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the tokens of ``mask`` (unbiased variance, as veRL's
    masked_whiten); 0 off the mask."""
    mean = masked_mean(x, mask)
    n = mask.sum()
    var = (((x - mean) ** 2) * mask).sum() / (n - 1).clamp(min=1)
    return (x - mean) * torch.rsqrt(var + eps) * mask


def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                       clip_eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped value loss per token (veRL's compute_value_loss, before aggregation):

        0.5 * max((V - G)^2, (V_old + clip(V - V_old, -eps, eps) - G)^2)

    and the mask of tokens where the clipped term was the larger one."""
    clipped = old_values + (values - old_values).clamp(-clip_eps, clip_eps)
    plain, bounded = (values - returns) ** 2, (clipped - returns) ** 2
    return 0.5 * torch.maximum(plain, bounded), bounded > plain


def explained_variance(values: torch.Tensor, returns: torch.Tensor,
                       mask: torch.Tensor) -> float:
    """1 - Var(G - V) / Var(G) over the response tokens: 1 a perfect critic, 0 one that
    predicts the mean, negative worse than that."""
    var = masked_mean((returns - masked_mean(returns, mask)) ** 2, mask)
    err = returns - values
    var_err = masked_mean((err - masked_mean(err, mask)) ** 2, mask)
    return float(1.0 - var_err / var) if var > 0 else 0.0


# --------------------------------------------------------------------------- the loss


def k3(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(p || q) from samples of p: (r - 1) - log r, r = q/p.
    Non-negative, unbiased, low variance (Schulman's estimator)."""
    log_r = logq - logp
    return torch.exp(log_r) - 1.0 - log_r


def tis_weights(learner_logp: torch.Tensor, behaviour_logp: torch.Tensor,
                cap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-level truncated importance weights min(pi_learner / pi_behaviour, cap),
    detached, and the boolean mask of tokens whose weight was clipped."""
    w = torch.exp(learner_logp.detach() - behaviour_logp)
    clipped = w > cap
    return w.clamp(max=cap), clipped


def clipped_surrogate(new_logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor,
                      clip_low: float, clip_high: float | None = None,
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO objective min(ratio * A, clip(ratio, 1 - low, 1 + high) * A) (to
    maximize), and the mask of tokens where the clipped branch was taken. ``adv`` is (B, 1)
    or (B, R). ``clip_high`` unset = ``clip_low`` (symmetric); above it is DAPO's
    clip-higher."""
    high = clip_low if clip_high is None else clip_high
    ratio = torch.exp(new_logp - old_logp)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + high) * adv
    return torch.minimum(unclipped, clipped), clipped < unclipped


def token_weights(mask: torch.Tensor, mode: str, norm_tokens: int | None = None
                  ) -> torch.Tensor:
    """(B, R) weights w such that a minibatch's loss is sum(w * per_token), for veRL's
    loss_agg_mode. A row of ``mask`` that is all 0 (a sequence out of the loss) weighs
    nothing and does not count as a sequence. ``norm_tokens``: the constant of
    "seq-mean-token-sum-norm" (rollout.max_new_tokens; unset = R).

        token-mean               1 / (tokens of the minibatch)
        seq-mean-token-sum       1 / S                  S = sequences with tokens
        seq-mean-token-mean      1 / (S * L_i)          L_i = tokens of sequence i
        seq-mean-token-sum-norm  1 / (S * norm_tokens)
    """
    lengths = mask.sum(dim=-1, keepdim=True)                         # (B, 1)
    seqs = (lengths > 0).sum().clamp(min=1)
    if mode == "token-mean":
        w = mask / mask.sum().clamp(min=1)
    elif mode == "seq-mean-token-sum":
        w = mask / seqs
    elif mode == "seq-mean-token-mean":
        w = mask / (lengths.clamp(min=1) * seqs)
    elif mode == "seq-mean-token-sum-norm":
        w = mask / (seqs * (norm_tokens or mask.shape[-1]))
    else:
        raise ValueError(f"unknown loss_agg_mode {mode!r}")
    return w


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, mode: str,
              norm_tokens: int | None = None) -> torch.Tensor:
    """The minibatch's loss from (B, R) per-token losses under ``loss_agg_mode``."""
    return (per_token * token_weights(mask, mode, norm_tokens)).sum()


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)
