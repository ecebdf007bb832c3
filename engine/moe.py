"""Mixture-of-Experts routing: record the experts one forward chose, replay them in another.

    rollout (torch sampler, rollout.record_routing):
        RouterHooks(model).chosen()  after each forward   -> (N, L, k) expert ids
        kept per sequence position: prompt tokens (prefill) and every generated token
        that was fed back; Sample.routing (tokens fed, L, k)
    learner (learner.routing_replay):
        RouterHooks(policy, replay=True).route(recorded)  before the forward
        each router's choice of experts is swapped for the recorded one; its weights are
        recomputed from the learner's own router logits at the recorded experts:
            w = softmax(router_logits over all E experts)[recorded]          # (N, k)
            w = w / w.sum(-1)     only where the family renormalizes its top-k
                                  (norm_topk_prob = True; Mixtral always does)
        so with norm_topk_prob = False a replayed expert weighs its share of the full
        softmax, exactly what the model's own top-k gives it, and gradients reach the
        router through w. A position with no record (-1: the last generated token, which
        the sampler never fed back) keeps the router's own choice; it predicts nothing
        the loss reads.
    agreement:  same_experts(learner's own top-k, recorded)  per position: the same set
        of experts in every MoE layer (moe/routing_agreement averages it over the
        positions whose outputs predict response tokens).

Prompt tokens are replayed too: the hidden states that predict a response token depend on
every earlier position's routing, the prompt's included, so replaying only response
tokens would leave the learner's logprobs open to a prompt token's near-tied router.

The routers handled (MOE_ROUTERS) all compute, in transformers 5: hidden (N, H) ->
router_logits (N, E), top-k weights (N, k), top-k ids (N, k), softmax over all experts
before the top-k; other MoE families are refused at config validation.
"""

from __future__ import annotations

import functools

import torch

from engine.config.model_task import MOE_ROUTERS

ALWAYS_NORMALIZED = {"MixtralTopKRouter"}
"""Router classes that renormalize their top-k weights whatever the config says."""


def moe_routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Every router of ``model``, in layer order (only MoE layers have one)."""
    kinds = set(MOE_ROUTERS.values())
    return [m for m in model.modules() if type(m).__name__ in kinds]


def normalizes(router: torch.nn.Module) -> bool:
    return type(router).__name__ in ALWAYS_NORMALIZED or bool(router.norm_topk_prob)


def same_experts(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(K,) bool: row i of ``a`` and ``b`` (K, L, k) picks the same set of experts in
    every layer (the order within the top-k does not matter: the sum does not see it)."""
    return (a.sort(-1).values == b.sort(-1).values).all(-1).all(-1)


class RouterHooks:
    """Forward hooks on every router of ``model``. Each forward of the model leaves what
    its routers chose in ``chosen()``; with ``replay``, ``route(recorded)`` makes the
    following forwards (a gradient-checkpointing recompute included) route by it."""

    def __init__(self, model: torch.nn.Module, replay: bool = False):
        self.routers = moe_routers(model)
        if not self.routers:
            raise ValueError(f"{type(model).__name__} has no Mixture-of-Experts router this "
                             f"engine can record (families: {', '.join(MOE_ROUTERS)})")
        self.replay = replay
        self.layers, self.top_k = len(self.routers), self.routers[0].top_k
        self._chosen: list[torch.Tensor | None] = [None] * self.layers
        self._recorded: torch.Tensor | None = None
        self.agreed: torch.Tensor | None = None   # set by engine.learner.batch
        self._handles = [r.register_forward_hook(functools.partial(self._hook, layer))
                         for layer, r in enumerate(self.routers)]

    def route(self, recorded: torch.Tensor | None) -> None:
        """The experts (N, L, k) the next forwards use, N = the forward's tokens in
        row-major order (-1: the router's own choice); None: the router's own everywhere.
        Ignored unless this replays."""
        self._recorded = recorded.long() if recorded is not None and self.replay else None

    def chosen(self) -> torch.Tensor:
        """(N, L, k): the experts each router picked itself in the last forward."""
        return torch.stack(self._chosen, dim=1)  # type: ignore[arg-type]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()

    def _hook(self, layer: int, router: torch.nn.Module, args, out):
        logits, scores, chosen = out               # (N, E), (N, k), (N, k)
        self._chosen[layer] = chosen.detach()
        if self._recorded is None:
            return None
        recorded = self._recorded[:, layer]                                    # (N, k)
        if recorded.shape != chosen.shape:
            raise ValueError(f"recorded routing {tuple(recorded.shape)} does not fit the "
                             f"forward's {tuple(chosen.shape)} tokens x top-k")
        experts = torch.where(recorded >= 0, recorded, chosen)
        weights = torch.softmax(logits.float(), dim=-1).gather(-1, experts)
        if normalizes(router):
            weights = weights / weights.sum(-1, keepdim=True)
        return logits, weights.to(scores.dtype), experts
