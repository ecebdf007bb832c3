"""The GRPO learner: one ``update`` per RL step.

    old_logp  = recompute(policy, batch)                 # before any optimizer step
    gap       = |behaviour_logp - old_logp|              # engine mismatch / staleness signal
    w_tis     = min(exp(old_logp - behaviour_logp), cap) # token-level TIS, detached
    for epoch in epochs, for minibatch in split(batch):
        ratio = exp(new_logp - old_logp)
        loss  = token_mean(-w_tis * min(ratio*A, clip(ratio)*A) + kl_coef * k3(new, ref))
        AdamW step with global grad-norm clip
    version += 1                                         # weights changed: a new policy

The learner owns the policy version; every weight sync carries it.
"""

from __future__ import annotations

import torch

from engine.config import GrpoConfig
from engine.learner.batch import PackedBatch, response_logprobs
from engine.learner.losses import clipped_surrogate, k3, masked_mean, tis_weights
from engine.weightsync.fingerprint import fingerprint


class Learner:
    def __init__(self, policy: torch.nn.Module, cfg: GrpoConfig, temperature: float,
                 seed: int, reference: torch.nn.Module | None = None):
        self.policy = policy.train()
        self.cfg = cfg
        # Learner logprobs are of the tempered distribution the sampler used (greedy -> 1).
        self.temperature = temperature if temperature > 0 else 1.0
        self.seed = seed
        self.reference = reference.eval().requires_grad_(False) if reference is not None else None
        self.optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr,
                                           weight_decay=cfg.weight_decay)
        self.version = 0
        self.step = 0

    def named_tensors(self) -> list[tuple[str, torch.Tensor]]:
        return [(n, p.detach()) for n, p in self.policy.named_parameters()]

    def fingerprint(self) -> str:
        return fingerprint(self.named_tensors())

    @torch.no_grad()
    def recompute(self, batch: PackedBatch) -> torch.Tensor:
        self.policy.eval()
        logp, _ = response_logprobs(self.policy, batch, self.temperature)
        self.policy.train()
        return logp

    def update(self, batch: PackedBatch) -> dict[str, float]:
        cfg, mask = self.cfg, batch.response_mask
        old_logp = self.recompute(batch)                                   # (B, R)
        ref_logp = None
        if self.reference is not None and cfg.kl_coef > 0:
            with torch.no_grad():
                ref_logp, _ = response_logprobs(self.reference, batch, self.temperature)
        gap = (batch.behaviour_logp - old_logp).abs() * mask
        w_tis, tis_clipped = tis_weights(old_logp, batch.behaviour_logp, cfg.tis_cap)
        metrics = {
            "logprob_gap/mean": float(masked_mean(gap, mask)),
            "logprob_gap/max": float(gap.max()),
            "logprob_gap/k3": float(masked_mean(k3(batch.behaviour_logp, old_logp), mask)),
            "tis/clip_frac": float(masked_mean(tis_clipped.float(), mask)),
        }
        if self.temperature != 1.0:
            # The gap to the untempered distribution: ~0 when the engine's logprobs ignore
            # temperature (TRL #4159), which the plain gap alone cannot tell from staleness.
            self.policy.eval()
            with torch.no_grad():
                raw, _ = response_logprobs(self.policy, batch, 1.0)
            self.policy.train()
            metrics["logprob_gap/untempered_mean"] = float(
                masked_mean((batch.behaviour_logp - raw).abs(), mask))

        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.step)
        losses, grad_norms, entropies, kls, clip_fracs = [], [], [], [], []
        n = len(batch)
        for _ in range(cfg.epochs):
            perm = torch.randperm(n, generator=gen)
            for idx in perm.chunk(cfg.minibatches):
                mb = batch.select(idx)
                m = mb.response_mask
                new_logp, entropy = response_logprobs(self.policy, mb, self.temperature,
                                                      with_entropy=True)
                surr, ppo_clipped = clipped_surrogate(new_logp, old_logp[idx],
                                                      mb.advantages[:, None], cfg.clip_eps)
                per_token = -w_tis[idx] * surr
                if ref_logp is not None:
                    kl = k3(new_logp, ref_logp[idx])
                    per_token = per_token + cfg.kl_coef * kl
                    kls.append(float(masked_mean(kl.detach(), m)))
                loss = masked_mean(per_token, m)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.max_grad_norm)
                self.optimizer.step()
                losses.append(float(loss.detach()))
                grad_norms.append(float(norm))
                entropies.append(float(masked_mean(entropy.detach(), m)))
                clip_fracs.append(float(masked_mean(ppo_clipped.float(), m)))
        self.step += 1
        self.version += 1

        def mean(xs: list[float]) -> float:
            return sum(xs) / len(xs) if xs else 0.0

        metrics.update({
            "learner/loss": mean(losses),
            "learner/grad_norm": mean(grad_norms),
            "learner/entropy": mean(entropies),
            "learner/kl_ref": mean(kls),
            "learner/clip_frac": mean(clip_fracs),
        })
        return metrics
