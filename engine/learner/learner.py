"""The policy learner: one ``update`` per RL step (GRPO; PPO's actor, engine.learner.ppo).

    old_logp  = recompute(policy, batch)                 # before any optimizer step
    gap       = |behaviour_logp - old_logp|              # engine mismatch / staleness signal
    w_tis     = min(exp(old_logp - behaviour_logp), cap) # token-level TIS, detached
    for epoch in epochs, for minibatch in split(batch):
        for micro in split(minibatch, learner.micro_batch_tokens):   # gradients accumulate
            ratio = exp(new_logp - old_logp)             # A: a completion's, or PPO's per token
            per_token = -w_tis * min(ratio*A, clip(ratio, 1-low, 1+high)*A)
                        + kl_coef * k3(new, ref)
            sum(w * per_token over micro).backward()     # w: token_weights of the minibatch
        AdamW step with global grad-norm clip
    version += 1                                         # weights changed: a new policy

The first optimizer step's rows need no separate recompute: its training forward runs
before any update, so its detached logprobs are their old_logp (ratio = 1), and the
learner saves that forward pass (veRL's on-policy shortcut, for the whole batch where
epochs = minibatches = 1 as in the demo recipes; 1/minibatches of it otherwise, the other
rows recomputed first). Not where dropout is active (train and eval forwards differ),
where MoE routing is recorded or replayed, or on a sharded learner (each rank trains its
rows).

The loss aggregates the whole minibatch (algorithm.loss_agg_mode: a token mean, or a mean
over sequences of their token sums or means): every token's weight w is fixed from the
minibatch's mask before it is split, so the accumulated gradient is the one big batch's
whatever the micro-batch split. Sequences out of the loss (algorithm.overlong "filter")
have weight 0 and do not count.

An MoE policy's routers carry hooks (engine.moe): the recompute compares their top-k with
the rollout's recorded routing (moe/routing_agreement), and learner.routing_replay routes
every forward of the update by the recorded experts.

Where it runs is ``[learner]`` (engine.config.LearnerConfig): the policy and the
reference live on the resolved device, batches move there, bf16 autocasts the forward
and backward while parameters and AdamW state stay float32. The learner owns the policy
version; every weight sync carries it.
"""

from __future__ import annotations

import torch

from engine import metrics as M
from engine.config import AlgorithmConfig, LearnerConfig
from engine.learner.batch import PackedBatch, micro_batches, response_logprobs
from engine.learner.device import adamw, autocast, compile_layers, resolve_device
from engine.learner.losses import (
    clipped_surrogate,
    k3,
    masked_mean,
    tis_weights,
    token_weights,
)
from engine.moe import RouterHooks, moe_routers
from engine.seeds import minibatch_seed
from engine.weightsync.fingerprint import fingerprint


def split_rows(batch: PackedBatch, idx: torch.Tensor,
               setup: LearnerConfig) -> list[torch.Tensor]:
    """Rows ``idx`` split under learner.micro_batch_tokens, counting the tokens the
    forward layout computes (real ones packed, the full padded width padded)."""
    width = batch.input_ids.shape[1]
    costs = batch.row_tokens() if setup.packing else [width] * len(batch)
    return micro_batches(idx, costs, setup.micro_batch_tokens)


def dropout_active(model: torch.nn.Module) -> bool:
    """Whether a train-mode forward differs from an eval-mode one: a dropout module with
    p > 0, or a transformers config with a nonzero *dropout* / *pdrop* rate."""
    if any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0
           for m in model.modules()):
        return True
    config = getattr(model, "config", None)
    rates = vars(config).items() if config is not None else ()
    return any(("dropout" in k or "pdrop" in k) and isinstance(v, float) and v > 0
               for k, v in rates)


def effective_sample_size(weights: torch.Tensor) -> float:
    """(sum w)^2 / (n sum w^2) of a 1-d tensor of non-negative weights: 1 when they are
    equal, 1/n when one carries them all."""
    total, squares = weights.sum(), weights.square().sum()
    return float(total.square() / (len(weights) * squares)) if squares > 0 else 0.0


def importance_metrics(learner_logp: torch.Tensor, behaviour_logp: torch.Tensor,
                       adv: torch.Tensor, mask: torch.Tensor, cap: float) -> dict[str, float]:
    """The behaviour-vs-learner importance ratios of a batch's response tokens and what
    they leave of it: tis/ratio_{mean,min,p01}, tis/clip_frac, and the effective sample
    size of the loss's token weights w|A| (tis/ess) next to that of w alone
    (tis/ess_ratio), over the tokens that carry an advantage (none: no ESS reported).
    ``adv``, ``mask``: (B, R)."""
    w, clipped = tis_weights(learner_logp, behaviour_logp, cap)               # (B, R)
    on = mask.bool()
    ratio = torch.exp(learner_logp.detach() - behaviour_logp)[on].float()    # (tokens,)
    out = {M.TIS_CLIP_FRAC: float(masked_mean(clipped.float(), mask))}
    if ratio.numel():      # kthvalue: torch.quantile refuses over 2^24 tokens
        out |= {M.TIS_RATIO_MEAN: float(ratio.mean()), M.TIS_RATIO_MIN: float(ratio.min()),
                M.TIS_RATIO_P01: float(ratio.kthvalue(max(1, ratio.numel() // 100)).values)}
    signal = on & (adv != 0)
    if signal.any():
        weights = w[signal].float()
        out[M.TIS_ESS] = effective_sample_size(weights * adv[signal].abs().float())
        out[M.TIS_ESS_RATIO] = effective_sample_size(weights)
    return out


# A minibatch step's figures, averaged over the step's minibatches, and their names.
REPORTED = {"loss": M.LEARNER_LOSS, "grad_norm": M.LEARNER_GRAD_NORM,
            "entropy": M.LEARNER_ENTROPY, "kl_ref": M.LEARNER_KL_REF,
            "clip_frac": M.LEARNER_CLIP_FRAC}


class Learner:
    def __init__(self, policy: torch.nn.Module, cfg: AlgorithmConfig, temperature: float,
                 seed: int, reference: torch.nn.Module | None = None,
                 setup: LearnerConfig | None = None, norm_tokens: int | None = None,
                 top_p: float = 1.0):
        self.setup = setup = setup or LearnerConfig()
        # loss_agg_mode "seq-mean-token-sum-norm" divides by this constant (the rollout's
        # max_new_tokens); unset, by the batch's padded response width.
        self.norm_tokens = norm_tokens
        self.device = resolve_device(setup.device)
        self.policy = policy.to(self.device).train()
        if setup.gradient_checkpointing:
            self.policy.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        self.cfg = cfg
        # Learner logprobs are of the distribution the sampler drew from: logits /
        # temperature, then the top-p nucleus renormalized (engine.sampling); greedy -> 1.
        self.temperature = temperature if temperature > 0 else 1.0
        self.top_p = top_p if temperature > 0 else 1.0
        self.seed = seed
        # The KL reference is never trained: with the learner on its device, or kept in
        # host memory and run on the CPU (learner.reference = "cpu") to spare the device.
        self.reference_device = (self.device if setup.reference == "device"
                                 else torch.device("cpu"))
        self.reference = (reference.to(self.reference_device).eval().requires_grad_(False)
                          if reference is not None else None)
        # Hooks on the policy's MoE routers: the agreement of its routing with the
        # rollout's, and learner.routing_replay (engine.moe). Dense models have none.
        self.router = (RouterHooks(self.policy, replay=setup.routing_replay)
                       if setup.routing_replay or moe_routers(self.policy) else None)
        if setup.compile:
            if self.router is not None:
                raise ValueError("learner.compile = true compiles dense decoder layers, and "
                                 "this policy's MoE routers carry hooks (routing agreement, "
                                 "learner.routing_replay); set learner.compile = false")
            compile_layers(self.policy)
        self.optimizer = adamw(self.policy, cfg.lr, cfg.weight_decay)
        self.version = 0
        self.step = 0
        self.last_logprobs: torch.Tensor | None = None   # (B, R) of the last update

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def set_lr(self, lr: float) -> None:
        """Every param group's learning rate, from the next optimizer step on (a live
        control; a checkpoint keeps it, in the optimizer's state)."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def named_tensors(self) -> list[tuple[str, torch.Tensor]]:
        """The policy's parameters, on the learner's device (weight sync reads them)."""
        return [(n, p.detach()) for n, p in self.policy.named_parameters()]

    def fingerprint(self) -> str:
        return fingerprint(self.named_tensors())

    def logprobs(self, model: torch.nn.Module, batch: PackedBatch, temperature: float,
                 with_entropy: bool = False, top_p: float = 1.0,
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, R) response logprobs on this learner's device, layout and precision."""
        with autocast(self.device, self.setup):
            return response_logprobs(model, batch, temperature, with_entropy,
                                     packed=self.setup.packing, top_p=top_p,
                                     router=self.router if model is self.policy else None)

    @torch.no_grad()
    def reference_logprobs(self, batch: PackedBatch) -> torch.Tensor:
        """(B, R) on the learner's device, computed where the reference lives."""
        on = batch.to(self.reference_device)
        with autocast(self.reference_device, self.setup):
            return torch.cat([
                response_logprobs(self.reference, on.select(i), self.temperature,
                                  packed=self.setup.packing, top_p=self.top_p)[0]
                for i in self._micro_batches(on, torch.arange(len(on)))]).to(self.device)

    @torch.no_grad()
    def recompute(self, batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(B, R) logprobs before any optimizer step, and, when the batch carries the
        rollout's routing, whether the policy's own routing agreed per response token."""
        self.policy.eval()
        logps, agreed = [], []
        for i in self._micro_batches(batch, torch.arange(len(batch))):
            logps.append(self.logprobs(self.policy, batch.select(i), self.temperature,
                                       top_p=self.top_p)[0])
            if self.router is not None and self.router.agreed is not None:
                agreed.append(self.router.agreed)
        self.policy.train()
        return torch.cat(logps), torch.cat(agreed) if agreed else None

    def token_logprobs(self, rows: list[int]) -> list[list[float]]:
        """The learner's logprobs (recomputed before the last update) of those rows' response
        tokens, padding included: the caller cuts each to its response length."""
        return self.last_logprobs[rows].float().cpu().tolist()

    def _micro_batches(self, batch: PackedBatch, idx: torch.Tensor) -> list[torch.Tensor]:
        return split_rows(batch, idx, self.setup)

    def _train_runs(self, batch: PackedBatch,
                    idx: torch.Tensor) -> list[tuple[torch.Tensor, float]]:
        """The micro-batches this process trains on for minibatch ``idx``, each with the
        weight of its loss (engine.learner.sharded: a rank's share, padded)."""
        return [(micro, 1.0) for micro in self._micro_batches(batch, idx)]

    def _clip_grads(self) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(),
                                              self.cfg.max_grad_norm)
        return float(norm)

    def _sum_over_ranks(self, totals: torch.Tensor) -> torch.Tensor:
        return totals

    def update(self, batch: PackedBatch,
               token_advantages: torch.Tensor | None = None) -> dict[str, float]:
        """One RL step on ``batch``. Advantages are the batch's one per completion, or
        ``token_advantages`` (B, R) (PPO's GAE)."""
        cfg = self.cfg
        batch = batch.to(self.device)
        mask = batch.response_mask
        adv = (batch.advantages[:, None].expand_as(mask) if token_advantages is None
               else token_advantages.to(self.device))                      # (B, R)
        ref_logp = None
        if self.reference is not None and cfg.kl_coef > 0:
            ref_logp = self.reference_logprobs(batch)
        if self.temperature != 1.0:
            # The gap to the raw distribution (log_softmax(logits): no temperature, no
            # top-p, vLLM's raw_logprobs): ~0 when the engine's logprobs ignore temperature
            # (TRL #4159), which the plain gap alone cannot tell from staleness.
            self.policy.eval()
            with torch.no_grad():
                raw = torch.cat([self.logprobs(self.policy, batch.select(i), 1.0)[0]
                                 for i in self._micro_batches(batch, torch.arange(len(batch)))])
            self.policy.train()
            untempered = float(masked_mean((batch.behaviour_logp - raw).abs(), mask))
        gen = torch.Generator().manual_seed(minibatch_seed(self.seed, self.step))
        sums = {"loss": [], "grad_norm": [], "entropy": [], "kl_ref": [], "clip_frac": []}
        n = len(batch)
        perm = torch.randperm(n, generator=gen)
        if self.fuses_recompute():
            # the first optimizer step's own forward fills old_logp for its rows (and
            # weighs them by it); the other rows are recomputed, also before that step
            old_logp, agreed, w_tis = torch.zeros_like(batch.behaviour_logp), None, None
            rest = torch.ones(n, dtype=torch.bool)
            rest[perm.chunk(cfg.minibatches)[0]] = False
            if rest.any():
                rest = rest.nonzero().squeeze(1).to(self.device)
                old_logp[rest] = self.recompute(batch.select(rest))[0]
        else:
            old_logp, agreed = self.recompute(batch)                       # (B, R)
            w_tis = tis_weights(old_logp, batch.behaviour_logp, cfg.tis_cap)[0]
        for epoch in range(cfg.epochs):
            if epoch:
                perm = torch.randperm(n, generator=gen)
            for idx in perm.chunk(cfg.minibatches):
                step = self._minibatch_step(batch, idx, adv, old_logp, w_tis, ref_logp)
                if w_tis is None:                        # old_logp is whole from here on
                    w_tis = tis_weights(old_logp, batch.behaviour_logp, cfg.tis_cap)[0]
                for k, v in step.items():
                    sums[k].append(v)
        self.last_logprobs = old_logp                  # what the inspector shows per token
        gap = (batch.behaviour_logp - old_logp).abs() * mask
        metrics = {
            M.LOGPROB_GAP_MEAN: float(masked_mean(gap, mask)),
            M.LOGPROB_GAP_MAX: float(gap.max()),
            M.LOGPROB_GAP_K3: float(masked_mean(k3(batch.behaviour_logp, old_logp), mask)),
            **importance_metrics(old_logp, batch.behaviour_logp, adv, mask, cfg.tis_cap),
        }
        if agreed is not None:
            metrics[M.MOE_ROUTING_AGREEMENT] = float(agreed.float().mean())
        if self.temperature != 1.0:
            metrics[M.LOGPROB_GAP_UNTEMPERED_MEAN] = untempered
        self.step += 1
        self.version += 1

        def mean(xs: list[float]) -> float:
            return sum(xs) / len(xs) if xs else 0.0

        metrics.update({REPORTED[k]: mean(v) for k, v in sums.items()})
        metrics[M.LEARNER_LR] = self.lr  # what this step's optimizer steps used
        return metrics

    def fuses_recompute(self) -> bool:
        """Whether update() takes the first minibatch's old_logp from its own optimizer
        step's forward instead of a separate no-grad recompute (module docstring)."""
        return (self.router is None and type(self)._train_runs is Learner._train_runs
                and not dropout_active(self.policy))

    def _minibatch_step(self, batch: PackedBatch, idx: torch.Tensor, adv: torch.Tensor,
                        old_logp: torch.Tensor, w_tis: torch.Tensor | None,
                        ref_logp: torch.Tensor | None) -> dict[str, float]:
        """One optimizer step on the rows ``idx``, accumulated over their micro-batches.
        The loss is aggregated over the whole minibatch (algorithm.loss_agg_mode): each
        token's weight is fixed by the minibatch before it is split, so micro-batches and
        ranks only sum their shares. The other metrics are token means over it.
        ``w_tis`` None: the fused step (fuses_recompute) writes each micro-batch's detached
        logprobs into ``old_logp`` and weighs by them."""
        cfg = self.cfg
        mask = batch.response_mask
        n_tokens = mask[idx].sum().clamp(min=1)
        weights = torch.zeros_like(mask)                                 # (B, R)
        weights[idx] = token_weights(mask[idx] * batch.in_loss[idx, None], cfg.loss_agg_mode,
                                     self.norm_tokens)
        totals = torch.zeros(4, device=self.device)      # loss, entropy, kl, clipped tokens
        self.optimizer.zero_grad(set_to_none=True)
        for micro, weight in self._train_runs(batch, idx):
            mb = batch.select(micro)
            m = mb.response_mask
            new_logp, entropy = self.logprobs(self.policy, mb, self.temperature,
                                              with_entropy=True, top_p=self.top_p)
            if w_tis is None:
                old_logp[micro] = new_logp.detach()
                w = tis_weights(old_logp[micro], mb.behaviour_logp, cfg.tis_cap)[0]
            else:
                w = w_tis[micro]
            surr, ppo_clipped = clipped_surrogate(new_logp, old_logp[micro],
                                                  adv[micro], cfg.clip_low,
                                                  cfg.clip_high)
            per_token = -w * surr
            kl = torch.zeros((), device=self.device)
            if ref_logp is not None:
                kl_tok = k3(new_logp, ref_logp[micro])
                per_token = per_token + cfg.kl_coef * kl_tok
                kl = (kl_tok.detach() * m).sum()
            loss = (per_token * weights[micro]).sum() * weight
            loss.backward()                              # this micro-batch's share
            totals += torch.stack([loss.detach(), (entropy.detach() * m).sum() / n_tokens,
                                   kl / n_tokens,
                                   (ppo_clipped.float() * m).sum() / n_tokens]) * weight
        norm = self._clip_grads()
        self.optimizer.step()
        loss, entropy, kl, clipped = self._sum_over_ranks(totals).tolist()
        step = {"loss": loss, "grad_norm": norm, "entropy": entropy, "clip_frac": clipped}
        if ref_logp is not None:
            step["kl_ref"] = kl
        return step
