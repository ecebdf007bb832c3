"""Fault injection: wrappers at the loop's seams that make the real loop misbehave the way
the real bugs do. Nothing here emits a metric; the driver measures what the wrapped parts
actually did, so the alerts see only what an operator would.

    engine    = wrap_rollout(engine, faults, step)      unscaled_logprobs, straggler
    transport = wrap_transport(transport, engine, learner, faults)
                                                        skip_weight_sync, sleep_drops_weights,
                                                        version_reset, sync_hang
    reward    = wrap_reward(reward, faults, step)       slow_reward
    buffer    = wrap_buffer(buffer, faults, step)       staleness_overrun

``step`` answers the step in progress (the learner's step count: during step s's rollout
it is s, during the sync that ends step s it is s + 1). With no fault configured every
wrap_* returns its argument unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from engine.config import FaultsConfig
from engine.experience import ExperienceBuffer, Sample
from engine.rollout.base import Completion, RolloutEngine, SamplingParams
from engine.weightsync.base import SyncResult, WeightTransport

StepFn = Callable[[], int]


# --------------------------------------------------------------------------- rollout

def untempered_logprobs(engine, prompts: list[list[int]],
                        outs: list[Completion]) -> list[list[float]]:
    """Logprobs of each sampled token under log_softmax(logits), i.e. ignoring temperature
    and top-p: what a backend with the TRL #4159 bug returns. Teacher-forced through the
    torch engine's own KV model, left-padded like its prefill."""
    P = max(len(p) for p in prompts)
    R = max(max((len(o.token_ids) for o in outs), default=0), 1)
    B, S = len(prompts), P + R
    ids = torch.full((B, S), engine.pad_id, dtype=torch.long)
    valid = torch.zeros((B, S), dtype=torch.bool)
    for i, (p, o) in enumerate(zip(prompts, outs, strict=True)):
        ids[i, P - len(p):P] = torch.tensor(p)
        ids[i, P:P + len(o.token_ids)] = torch.tensor(o.token_ids, dtype=torch.long)
        valid[i, P - len(p):P + len(o.token_ids)] = True
    positions = (valid.long().cumsum(-1) - 1).clamp(min=0)                  # (B, S)
    dtype = engine.tensors["model.embed_tokens.weight"].dtype
    with torch.no_grad():
        logits = engine.model.forward(ids, positions, engine.model.new_cache(B, S, dtype),
                                      0, valid)                             # (B, S, V)
        logp = torch.log_softmax(logits[:, P - 1:-1].float(), dim=-1)      # (B, R, V)
        picked = logp.gather(-1, ids[:, P:, None]).squeeze(-1)             # (B, R)
    return [picked[i, :len(o.token_ids)].tolist() for i, o in enumerate(outs)]


class FaultyRollout:
    """A rollout engine whose generate() misbehaves from a step on; weights pass through."""

    def __init__(self, inner: RolloutEngine, faults: FaultsConfig, step: StepFn):
        self.inner, self.faults, self.step = inner, faults, step

    def __getattr__(self, name):          # load_weights, weight_version, fingerprint, ...
        return getattr(self.inner, name)

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 seed: int) -> list[Completion]:
        outs = self.inner.generate(prompts, params, seed)
        unscaled, straggler = self.faults.unscaled_logprobs, self.faults.straggler
        if unscaled is not None and self.step() >= unscaled.from_step:
            for o, lps in zip(outs, untempered_logprobs(self.inner, prompts, outs), strict=True):
                o.logprobs = lps
        if straggler is not None and self.step() >= straggler.from_step:
            # The batch returns when its slowest generation does.
            time.sleep(straggler.seconds)
        return outs


def wrap_rollout(engine: RolloutEngine, faults: FaultsConfig, step: StepFn) -> RolloutEngine:
    if faults.unscaled_logprobs is None and faults.straggler is None:
        return engine
    return FaultyRollout(engine, faults, step)


# --------------------------------------------------------------------------- weight sync

class FaultyTransport:
    """A weight transport whose syncs misbehave. The receiver still fingerprints what it
    serves, so the SyncResult tells the truth about what the engine holds."""

    def __init__(self, inner: WeightTransport, engine: RolloutEngine, learner,
                 faults: FaultsConfig):
        self.inner, self.engine, self.learner, self.faults = inner, engine, learner, faults
        self.name = inner.name
        self.first_weights: list[tuple[str, torch.Tensor]] | None = None
        self.skippable_syncs = 0

    def push(self, named_tensors: Sequence[tuple[str, torch.Tensor]], version: int,
             learner_fingerprint: str, version_ready_at: float) -> SyncResult:
        f, step = self.faults, self.learner.step - 1      # the step this sync ends
        if self.first_weights is None:
            self.first_weights = [(n, t.detach().clone()) for n, t in named_tensors]
        if f.sync_hang is not None and step == f.sync_hang.at_step:
            time.sleep(f.sync_hang.seconds)
        if f.version_reset is not None and step == f.version_reset.at_step:
            self.learner.version = version = 1
        skip = f.skip_weight_sync
        if skip is not None and step >= skip.from_step:
            self.skippable_syncs += 1
            if self.skippable_syncs % skip.every == 0:
                # The engine takes the version number but no tensors: old weights, new label.
                report = self.engine.load_weights([], version)
                return SyncResult(
                    transport=self.name, version_learner=version,
                    version_rollout=report.version, fingerprint_learner=learner_fingerprint,
                    fingerprint_rollout=report.fingerprint, bytes=report.bytes,
                    latency_s=time.time() - version_ready_at)
        res = self.inner.push(named_tensors, version, learner_fingerprint, version_ready_at)
        sleep = f.sleep_drops_weights
        if sleep is not None and step >= sleep.from_step:
            # Woken from sleep, the engine reloads the weights it was first given.
            report = self.engine.load_weights(self.first_weights, version)
            res = SyncResult(
                transport=res.transport, version_learner=version,
                version_rollout=report.version, fingerprint_learner=learner_fingerprint,
                fingerprint_rollout=report.fingerprint, bytes=res.bytes,
                latency_s=time.time() - version_ready_at)
        return res


def wrap_transport(transport: WeightTransport, engine: RolloutEngine, learner,
                   faults: FaultsConfig) -> WeightTransport:
    if all(x is None for x in (faults.skip_weight_sync, faults.sleep_drops_weights,
                               faults.version_reset, faults.sync_hang)):
        return transport
    return FaultyTransport(transport, engine, learner, faults)


# --------------------------------------------------------------------------- reward

class SlowReward:
    def __init__(self, inner, seconds: float, from_step: int, step: StepFn):
        self.inner, self.seconds, self.from_step, self.step = inner, seconds, from_step, step

    def score(self, problems, texts, finished) -> list[float]:
        if self.step() >= self.from_step:
            time.sleep(self.seconds)
        return self.inner.score(problems, texts, finished)


def wrap_reward(reward, faults: FaultsConfig, step: StepFn):
    slow = faults.slow_reward
    return reward if slow is None else SlowReward(reward, slow.seconds, slow.from_step, step)


# --------------------------------------------------------------------------- buffer

class OverrunBuffer:
    """An experience buffer that, from a step on, hands out the groups of ``lag`` steps
    earlier instead of the fresh ones, and never drops a group for staleness: samples
    older than the policy's bound reach the learner."""

    def __init__(self, inner: ExperienceBuffer, from_step: int, lag: int, step: StepFn):
        self.inner, self.from_step, self.lag, self.step = inner, from_step, lag, step
        self.history: list[list[list[Sample]]] = []     # the last lag + 1 batches, oldest first

    @property
    def dropped_stale(self) -> int:
        return self.inner.dropped_stale

    def put(self, group: list[Sample]) -> None:
        self.inner.put(group)

    def __len__(self) -> int:
        return len(self.inner)

    def take(self, n_groups: int, learner_version: int) -> list[list[Sample]]:
        bound, self.inner.max_staleness = self.inner.max_staleness, None
        try:
            fresh = self.inner.take(n_groups, learner_version)
        finally:
            self.inner.max_staleness = bound
        self.history = [*self.history[-self.lag:], fresh]
        if self.step() < self.from_step or len(self.history) <= self.lag:
            return fresh
        return self.history[-1 - self.lag]


def wrap_buffer(buffer: ExperienceBuffer, faults: FaultsConfig, step: StepFn):
    over = faults.staleness_overrun
    return buffer if over is None else OverrunBuffer(buffer, over.from_step, over.lag, step)
