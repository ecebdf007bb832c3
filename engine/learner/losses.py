"""GRPO pieces as pure tensor functions (unit-tested on hand-made numbers).

Shapes: B sequences, R response tokens; ``mask`` (B, R) is 1 on real response tokens.
"""

from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, group_size: int, normalize_std: bool,
                     eps: float = 1e-6) -> torch.Tensor:
    """(B,) rewards ordered group by group -> (B,) advantages r - mean(group) [/ std]."""
    r = rewards.view(-1, group_size)                                  # (G, K)
    adv = r - r.mean(dim=1, keepdim=True)
    if normalize_std:
        adv = adv / (r.std(dim=1, keepdim=True, unbiased=False) + eps)
    return adv.reshape(-1)


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
                      clip_eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO objective min(ratio * A, clip(ratio) * A) (to maximize), and the mask
    of tokens where the clipped branch was taken. ``adv`` is (B, 1) or (B, R)."""
    ratio = torch.exp(new_logp - old_logp)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * adv
    return torch.minimum(unclipped, clipped), clipped < unclipped


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)
