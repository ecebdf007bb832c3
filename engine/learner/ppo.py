"""PPO: the policy learner plus a critic (``algorithm.type = "ppo"``), one step:

    values  = critic(batch)                               (B, R) V(s_t), before any step
    r_t     = reward on the last sampled token, 0 before it  (batch.token_rewards; a
              trajectory's per-turn rewards on their turns with task.env.reward_credit)
    A, G    = gae(r, values, gamma, lam)                  returns G = A + values; a
              trajectory's observations are passed over (no step, no value)
    A       = whiten(A) over the batch's response tokens  (algorithm.whiten_advantages)
    critic:  for epoch, minibatch (as the actor's):        [span: critic]
                 0.5 * max((V - G)^2, (clip(V, V_old +- value_clip_eps) - G)^2)
                 aggregated by loss_agg_mode; its own AdamW, lr algorithm.critic.lr
    actor:   Learner.update(batch, A)                      [span: learner]

The critic is the policy's architecture with a scalar head (engine.model.load_critic),
held by one component, ``Critic``, wherever it runs:

    colocated (placement.critic_devices = 0): PpoLearner holds it, on the learner's device;
        critic.update (values, GAE, value epochs), then the actor's update, in turn
    own bundle (critic_devices = 1): a CriticWorker actor holds it
        critic.estimate (values, GAE) -> advantages -> the actor's update  } concurrently,
                                                       critic.train     } on two bundles

Its state goes into every checkpoint next to the policy's:

    step_000012/critic/              the critic's HF directory (a fork's critic.path)
    step_000012/critic_optimizer.pt  its AdamW state
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from engine import metrics as M
from engine.config import LearnerConfig, PpoConfig
from engine.learner.batch import PackedBatch, response_values
from engine.learner.device import adamw, autocast, resolve_device
from engine.learner.learner import Learner, split_rows
from engine.learner.losses import (
    clipped_value_loss,
    explained_variance,
    gae,
    masked_mean,
    masked_whiten,
    token_weights,
)
from engine.seeds import minibatch_seed

CRITIC_DIR = "critic"
CRITIC_OPTIMIZER = "critic_optimizer.pt"


class Critic:
    """The value model and its AdamW: values, GAE, the value update and their checkpoint
    state. ``step`` is the learner's step the batch trains (it seeds the critic's own
    minibatch shuffle, so a resumed run shuffles as the uninterrupted one did)."""

    def __init__(self, model: torch.nn.Module, cfg: PpoConfig, seed: int,
                 setup: LearnerConfig | None = None, norm_tokens: int | None = None):
        self.cfg, self.seed, self.norm_tokens = cfg, seed, norm_tokens
        self.setup = setup = setup or LearnerConfig()
        self.device = resolve_device(setup.device)
        self.model = model.to(self.device).train()
        if setup.gradient_checkpointing:
            self.model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        self.optimizer = adamw(self.model, cfg.critic.lr, cfg.critic.weight_decay)

    def values(self, batch: PackedBatch) -> torch.Tensor:
        """(B, R) the critic's values of ``batch`` (on its device)."""
        with autocast(self.device, self.setup):
            return response_values(self.model, batch, packed=self.setup.packing)

    @torch.no_grad()
    def old_values(self, batch: PackedBatch) -> torch.Tensor:
        batch = batch.to(self.device)
        self.model.eval()
        v = torch.cat([self.values(batch.select(i))
                       for i in split_rows(batch, torch.arange(len(batch)), self.setup)])
        self.model.train()
        return v

    def advantages(self, batch: PackedBatch, values: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, R) the actor's advantages and the critic's targets (returns)."""
        cfg, mask = self.cfg, batch.response_mask
        adv, returns = gae(batch.token_rewards, values, mask, cfg.gamma, cfg.lam)
        if cfg.whiten_advantages:
            adv = masked_whiten(adv, mask)
        return adv, returns

    def estimate(self, batch: PackedBatch
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Values before this step's training, and GAE from them: (B, R) advantages, old
        values, returns. What the actor needs; ``train`` takes the other two."""
        batch = batch.to(self.device)
        old = self.old_values(batch)                                       # (B, R)
        adv, returns = self.advantages(batch, old)
        return adv, old, returns

    def train(self, batch: PackedBatch, old: torch.Tensor, returns: torch.Tensor,
              step: int) -> dict[str, float]:
        """The critic's epochs toward ``returns``; critic/* metrics."""
        cfg = self.cfg
        batch = batch.to(self.device)
        mask = batch.response_mask
        # The critic's shuffle is its own (the actor's is minibatch_seed(seed, step)).
        gen = torch.Generator().manual_seed(minibatch_seed(self.seed + 1, step))
        losses, norms, clipped = [], [], []
        for _ in range(cfg.epochs):
            perm = torch.randperm(len(batch), generator=gen)
            for idx in perm.chunk(cfg.minibatches):
                loss, norm, frac = self._step(batch, idx, old, returns)
                losses.append(loss)
                norms.append(norm)
                clipped.append(frac)
        return {
            M.CRITIC_VALUE_LOSS: sum(losses) / len(losses),
            M.CRITIC_GRAD_NORM: sum(norms) / len(norms),
            M.CRITIC_VALUE_CLIP_FRAC: sum(clipped) / len(clipped),
            M.CRITIC_EXPLAINED_VARIANCE: explained_variance(old, returns, mask),
            M.CRITIC_VALUE_MEAN: float(masked_mean(old, mask)),
            M.CRITIC_RETURN_MEAN: float(masked_mean(returns, mask)),
            M.CRITIC_LR: float(self.optimizer.param_groups[0]["lr"]),
        }

    def update(self, batch: PackedBatch, step: int) -> tuple[torch.Tensor, dict[str, float]]:
        """``estimate`` then ``train``: the actor's (B, R) advantages (from the values
        before this step's critic training) and critic/*."""
        adv, old, returns = self.estimate(batch)
        return adv, self.train(batch, old, returns, step)

    def _step(self, batch: PackedBatch, idx: torch.Tensor, old: torch.Tensor,
              returns: torch.Tensor) -> tuple[float, float, float]:
        """One optimizer step on rows ``idx``, aggregated like the actor's loss
        (loss_agg_mode, weights fixed by the whole minibatch before micro-batching)."""
        cfg, mask = self.cfg, batch.response_mask
        weights = torch.zeros_like(mask)                                 # (B, R)
        weights[idx] = token_weights(mask[idx] * batch.in_loss[idx, None], cfg.loss_agg_mode,
                                     self.norm_tokens)
        n_tokens = mask[idx].sum().clamp(min=1)
        total, clipped = 0.0, 0.0
        self.optimizer.zero_grad(set_to_none=True)
        for micro in split_rows(batch, idx, self.setup):
            mb = batch.select(micro)
            values = self.values(mb)
            per_token, was_clipped = clipped_value_loss(values, old[micro], returns[micro],
                                                        cfg.value_clip_eps)
            loss = (per_token * weights[micro]).sum()
            loss.backward()
            total += float(loss.detach())
            clipped += float((was_clipped.float() * mb.response_mask).sum() / n_tokens)
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                              cfg.critic.max_grad_norm)
        self.optimizer.step()
        return total, float(norm), clipped

    # ------------------------------------------------------------------ checkpoints

    def save(self, d: Path) -> None:
        """critic/ and critic_optimizer.pt into directory ``d``."""
        self.model.save_pretrained(d / CRITIC_DIR, safe_serialization=True)
        torch.save(self.optimizer.state_dict(), d / CRITIC_OPTIMIZER)

    def restore_optimizer(self, d: Path) -> None:
        """The AdamW state from checkpoint ``d``, when it has one (a fork of a GRPO run
        starts its critic from critic.path with a fresh optimizer)."""
        if (d / CRITIC_OPTIMIZER).exists():
            self.optimizer.load_state_dict(torch.load(
                d / CRITIC_OPTIMIZER, weights_only=True, map_location=self.device))


def move_critic_state(src: Path, d: Path) -> None:
    """A critic's state saved elsewhere (by a CriticWorker, into ``src``) into checkpoint
    directory ``d`` while it is written, so the checkpoint appears whole or not at all."""
    for name in (CRITIC_DIR, CRITIC_OPTIMIZER):
        shutil.move(src / name, d / name)
    shutil.rmtree(src, ignore_errors=True)


class PpoLearner(Learner):
    """The learner with its critic beside it, on its device (critic_devices = 0)."""

    def __init__(self, policy: torch.nn.Module, critic: torch.nn.Module, cfg: PpoConfig,
                 temperature: float, seed: int, reference: torch.nn.Module | None = None,
                 setup: LearnerConfig | None = None, norm_tokens: int | None = None,
                 top_p: float = 1.0):
        super().__init__(policy, cfg, temperature, seed, reference, setup, norm_tokens, top_p)
        self.critic = Critic(critic, cfg, seed, self.setup, norm_tokens)

    def update_critic(self, batch: PackedBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """Values, GAE and the critic's epochs on ``batch``; returns the actor's (B, R)
        advantages (from the values before this step's critic training) and critic/*."""
        return self.critic.update(batch, self.step)


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
