"""The distribution a rollout samples from, written once for the sampler and the learner.

    logits (N, V) -> / temperature -> top-p: drop the least likely tokens while the mass
    they hold together stays <= 1 - top_p (the top token is always kept) -> log_softmax

This is vLLM's "processed_logprobs" (v1/sample/ops/topk_topp_sampler.py,
apply_top_k_top_p_pytorch: the same ascending cumulative-mass rule), the torch sampler
draws from it, and the learner recomputes it to compare with the engine's behaviour
logprobs and to train on (README, "top_p: one distribution on both sides"). At
top_p = 1 it is log_softmax(logits / temperature).

The learner passes ``keep``, the token each row actually sampled: the engine had it in its
nucleus, and a token on the nucleus edge can fall just outside the learner's own when the
two computed the logits to a different rounding; keeping it puts the learner on the
engine's support instead of giving the token probability 0.
"""

from __future__ import annotations

import torch


def outside_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """(N, V) bool: the tokens of each row of ``logits`` (N, V) that top-p drops."""
    ordered, order = logits.sort(dim=-1)                                   # ascending
    mass = ordered.softmax(dim=-1).cumsum(dim=-1)                          # (N, V)
    drop = mass <= 1.0 - top_p
    drop[..., -1] = False                                                  # at least one
    return torch.zeros_like(drop).scatter(-1, order, drop)


def processed_logprobs(logits: torch.Tensor, temperature: float, top_p: float,
                       keep: torch.Tensor | None = None) -> torch.Tensor:
    """(N, V) log-probabilities of the sampling distribution over float ``logits``;
    -inf outside the nucleus. ``keep`` (N,): a token id per row never dropped.
    Differentiable in ``logits``; the nucleus itself is a constant of the step."""
    scaled = logits / temperature
    if top_p < 1.0:
        with torch.no_grad():
            drop = outside_top_p(scaled, top_p)
            if keep is not None:
                drop.scatter_(-1, keep[:, None], False)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return torch.log_softmax(scaled, dim=-1)


def entropy(logp: torch.Tensor) -> torch.Tensor:
    """(N,) entropy of each row of log-probabilities (N, V); dropped tokens (-inf) add 0."""
    return -(logp.exp() * logp.clamp(min=torch.finfo(logp.dtype).min)).sum(-1)
