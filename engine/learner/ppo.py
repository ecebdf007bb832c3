"""PPO: the policy learner plus a critic (``algorithm.type = "ppo"``), one step:

    values  = critic(batch)                               (B, R) V(s_t), before any step
    r_t     = reward on the last response token, 0 before it    (losses.terminal_rewards)
    A, G    = gae(r, values, gamma, lam)                  returns G = A + values
    A       = whiten(A) over the batch's response tokens  (algorithm.whiten_advantages)
    critic:  for epoch, minibatch (as the actor's):        [span: critic]
                 0.5 * max((V - G)^2, (clip(V, V_old +- value_clip_eps) - G)^2)
                 aggregated by loss_agg_mode; its own AdamW, lr algorithm.critic.lr
    actor:   Learner.update(batch, A)                      [span: learner]

The critic is the policy's architecture with a scalar head (engine.model.load_critic);
it lives with the learner, on its device and precision, and its state goes into every
checkpoint next to the policy's:

    step_000012/critic/              the critic's HF directory (a fork's critic.path)
    step_000012/critic_optimizer.pt  its AdamW state
"""

from __future__ import annotations

from pathlib import Path

import torch

from engine.config import LearnerConfig, PpoConfig
from engine.learner.batch import PackedBatch, response_values
from engine.learner.device import autocast
from engine.learner.learner import Learner
from engine.learner.losses import (
    clipped_value_loss,
    explained_variance,
    gae,
    masked_mean,
    masked_whiten,
    terminal_rewards,
    token_weights,
)
from engine.seeds import minibatch_seed

CRITIC_DIR = "critic"
CRITIC_OPTIMIZER = "critic_optimizer.pt"


class PpoLearner(Learner):
    def __init__(self, policy: torch.nn.Module, critic: torch.nn.Module, cfg: PpoConfig,
                 temperature: float, seed: int, reference: torch.nn.Module | None = None,
                 setup: LearnerConfig | None = None, norm_tokens: int | None = None,
                 top_p: float = 1.0):
        super().__init__(policy, cfg, temperature, seed, reference, setup, norm_tokens, top_p)
        self.critic = critic.to(self.device).train()
        if self.setup.gradient_checkpointing:
            self.critic.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        self.critic_optimizer = torch.optim.AdamW(self.critic.parameters(),
                                                  lr=cfg.critic.lr,
                                                  weight_decay=cfg.critic.weight_decay)

    def values(self, batch: PackedBatch) -> torch.Tensor:
        """(B, R) the critic's values of ``batch`` (on this learner's device)."""
        with autocast(self.device, self.setup):
            return response_values(self.critic, batch, packed=self.setup.packing)

    @torch.no_grad()
    def old_values(self, batch: PackedBatch) -> torch.Tensor:
        self.critic.eval()
        v = torch.cat([self.values(batch.select(i))
                       for i in self._micro_batches(batch, torch.arange(len(batch)))])
        self.critic.train()
        return v

    def advantages(self, batch: PackedBatch, values: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, R) the actor's advantages and the critic's targets (returns)."""
        cfg, mask = self.cfg, batch.response_mask
        adv, returns = gae(terminal_rewards(batch.rewards, mask), values, mask, cfg.gamma,
                           cfg.lam)
        if cfg.whiten_advantages:
            adv = masked_whiten(adv, mask)
        return adv, returns

    def update_critic(self, batch: PackedBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """Values, GAE and the critic's epochs on ``batch``; returns the actor's (B, R)
        advantages (from the values before this step's critic training) and critic/*."""
        cfg = self.cfg
        batch = batch.to(self.device)
        mask = batch.response_mask
        old = self.old_values(batch)                                       # (B, R)
        adv, returns = self.advantages(batch, old)
        # The critic's shuffle is its own (the actor's is minibatch_seed(seed, step)).
        gen = torch.Generator().manual_seed(minibatch_seed(self.seed + 1, self.step))
        losses, norms, clipped = [], [], []
        for _ in range(cfg.epochs):
            perm = torch.randperm(len(batch), generator=gen)
            for idx in perm.chunk(cfg.minibatches):
                loss, norm, frac = self._critic_step(batch, idx, old, returns)
                losses.append(loss)
                norms.append(norm)
                clipped.append(frac)
        metrics = {
            "critic/value_loss": sum(losses) / len(losses),
            "critic/grad_norm": sum(norms) / len(norms),
            "critic/value_clip_frac": sum(clipped) / len(clipped),
            "critic/explained_variance": explained_variance(old, returns, mask),
            "critic/value_mean": float(masked_mean(old, mask)),
            "critic/return_mean": float(masked_mean(returns, mask)),
            "critic/lr": float(self.critic_optimizer.param_groups[0]["lr"]),
        }
        return adv, metrics

    def _critic_step(self, batch: PackedBatch, idx: torch.Tensor, old: torch.Tensor,
                     returns: torch.Tensor) -> tuple[float, float, float]:
        """One critic optimizer step on rows ``idx``, aggregated like the actor's loss
        (loss_agg_mode, weights fixed by the whole minibatch before micro-batching)."""
        cfg, mask = self.cfg, batch.response_mask
        weights = torch.zeros_like(mask)                                 # (B, R)
        weights[idx] = token_weights(mask[idx] * batch.in_loss[idx, None], cfg.loss_agg_mode,
                                     self.norm_tokens)
        n_tokens = mask[idx].sum().clamp(min=1)
        total, clipped = 0.0, 0.0
        self.critic_optimizer.zero_grad(set_to_none=True)
        for micro in self._micro_batches(batch, idx):
            mb = batch.select(micro)
            values = self.values(mb)
            per_token, was_clipped = clipped_value_loss(values, old[micro], returns[micro],
                                                        cfg.value_clip_eps)
            loss = (per_token * weights[micro]).sum()
            loss.backward()
            total += float(loss.detach())
            clipped += float((was_clipped.float() * mb.response_mask).sum() / n_tokens)
        norm = torch.nn.utils.clip_grad_norm_(self.critic.parameters(),
                                              cfg.critic.max_grad_norm)
        self.critic_optimizer.step()
        return total, float(norm), clipped

    # ------------------------------------------------------------------ checkpoints

    def save_critic(self, d: Path) -> None:
        self.critic.save_pretrained(d / CRITIC_DIR, safe_serialization=True)
        torch.save(self.critic_optimizer.state_dict(), d / CRITIC_OPTIMIZER)

    def restore_critic_optimizer(self, d: Path) -> None:
        """The critic's AdamW state from checkpoint ``d``, when it has one (a fork of a
        GRPO run starts its critic from critic.path with a fresh optimizer)."""
        if (d / CRITIC_OPTIMIZER).exists():
            self.critic_optimizer.load_state_dict(torch.load(
                d / CRITIC_OPTIMIZER, weights_only=True, map_location=self.device))


def critic_source(cfg: PpoConfig, policy_dir: Path, checkpoint: Path | None) -> Path:
    """Where a PPO run's critic starts: the checkpoint's own critic (a resume, or a fork
    of a PPO run), else algorithm.critic.path, else the policy it starts from. A
    checkpoint without a critic (a GRPO run's) needs critic.path: its policy has trained
    away from any value the critic could start with."""
    if checkpoint is not None and (checkpoint / CRITIC_DIR).is_dir():
        return checkpoint / CRITIC_DIR
    if cfg.critic.path is not None:
        return Path(cfg.critic.path).expanduser()
    if checkpoint is not None:
        raise ValueError(f"checkpoint {checkpoint} has no critic (it was written by a run "
                         f'without one, e.g. algorithm.type = "grpo"); set '
                         f"algorithm.critic.path to a critic (or a model) to start it from")
    return policy_dir
