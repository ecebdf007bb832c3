"""Fault injection: wrappers at the loop's seams that make the real loop misbehave the way
the real bugs do. Nothing here emits a metric; the loop measures what the wrapped parts
actually did, so the alerts see only what an operator would.

    engine    = wrap_rollout(engine, faults, step)      unscaled_logprobs, straggler,
                                                        importance_collapse, no_stop (generate)
                                                        skip_weight_sync, sleep_drops_weights,
                                                        sync_hang (load_weights: the receiver)
    resets_version(faults, step)                        version_reset (the learner's counter)
    sharpen_policy(policy, faults, step)                entropy_collapse (the learner's head)
    reward    = wrap_reward(reward, faults, step)       slow_reward
    env       = wrap_env(env, faults, step)             slow_env, env_error (each
                                                        trajectory's environment)
    buffer    = wrap_buffer(buffer, faults, step)       staleness_overrun
    skipped_on_resume(faults)                           skip_on_resume (the data position a
                                                        resumed run starts from)
    dies_at(faults, step)                               kill_rollout_worker (the rollout
                                                        worker's process, SIGKILL)
    for_replacement(cfg)                                the config a replacement worker gets

The wrappers sit in the rollout worker (engine/orchestration/workers.py) and the loop,
so a fault behaves the same in process and on Ray, with every transport. ``step``
answers the step in progress: s during step s's rollout and during the sync that ends
step s. With no fault configured every wrap_* returns its argument unchanged.
"""

from __future__ import annotations

import dataclasses
import os
import random
import signal
import time
from collections.abc import Callable, Iterable

import torch

from engine.config import EnvErrorFault, FaultsConfig, RunConfig, SlowEnvFault
from engine.experience import ExperienceBuffer, Sample
from engine.rollout.base import (
    Completion,
    OnComplete,
    RolloutEngine,
    SamplingParams,
    WeightReport,
)

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
    with torch.no_grad():
        logits = engine.model.forward(ids, positions, engine.model.new_cache(B, S, engine.dtype),
                                      0, valid)                             # (B, S, V)
        logp = torch.log_softmax(logits[:, P - 1:-1].float(), dim=-1)      # (B, R, V)
        picked = logp.gather(-1, ids[:, P:, None]).squeeze(-1)             # (B, R)
    return [picked[i, :len(o.token_ids)].tolist() for i, o in enumerate(outs)]


def _delegate(wrapper, name: str):
    """A fault wrapper's missing attribute, from the object it wraps. Dunders and ``inner``
    itself are not delegated: copy and unpickle look them up before ``inner`` is set."""
    if name == "inner" or name.startswith("__"):
        raise AttributeError(name)
    return getattr(wrapper.inner, name)


class FaultyRollout:
    """A rollout engine that misbehaves from a step on. Generation faults change what
    generate() returns; weight faults change what load_weights() leaves the engine
    serving. The engine still fingerprints what it serves, so every sync report tells the
    truth about the weights it holds. The first load (the run's initial sync) is honest."""

    def __init__(self, inner: RolloutEngine, faults: FaultsConfig, step: StepFn):
        self.inner, self.faults, self.step = inner, faults, step
        self.first_weights: list[tuple[str, torch.Tensor]] | None = None
        self.skippable_syncs = 0

    def __getattr__(self, name):          # weight_version, fingerprint, sleep, ...
        return _delegate(self, name)

    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int,
                 on_complete: OnComplete | None = None,
                 budgets: list[int] | None = None) -> list[Completion]:
        unscaled, straggler = self.faults.unscaled_logprobs, self.faults.straggler
        straggling = straggler is not None and self.step() >= straggler.from_step
        left = len(prompts)

        def late_last(i, c):
            # The batch's last generation finishes ``seconds`` after the rest (its caller
            # sees it late), and the batch returns when it does.
            nonlocal left
            left -= 1
            if left == 0:
                time.sleep(straggler.seconds)
            return on_complete(i, c) if on_complete is not None else False

        if self.faults.no_stop is not None and self.step() >= self.faults.no_stop.from_step:
            params = dataclasses.replace(params, ignore_eos=True)
        outs = self.inner.generate(prompts, params, seed,
                                   on_complete=late_last if straggling else on_complete,
                                   budgets=budgets)
        if straggling and left > 0:        # stopped early: the straggler still holds it
            time.sleep(straggler.seconds)
        if unscaled is not None and self.step() >= unscaled.from_step:
            for o, lps in zip(outs, untempered_logprobs(self.inner, prompts, outs), strict=True):
                o.logprobs = lps
        collapse = self.faults.importance_collapse
        if collapse is not None and self.step() >= collapse.from_step:
            pick = random.Random(seed)
            for o in outs:
                o.logprobs = [lp + collapse.nats if pick.random() < collapse.share else lp
                              for lp in o.logprobs]
        return outs

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]],
                     version: int, verify: bool = True) -> WeightReport:
        named = list(named_tensors)
        if self.first_weights is None:
            self.first_weights = [(n, t.detach().clone()) for n, t in named]
            return self.inner.load_weights(named, version, verify)
        f, step = self.faults, self.step()               # the step this sync ends
        if f.sync_hang is not None and step == f.sync_hang.at_step:
            time.sleep(f.sync_hang.seconds)
        skip = f.skip_weight_sync
        if skip is not None and step >= skip.from_step:
            self.skippable_syncs += 1
            if self.skippable_syncs % skip.every == 0:
                # The engine takes the version number but no tensors: old weights, new label.
                return self.inner.load_weights([], version, verify)
        report = self.inner.load_weights(named, version, verify)
        sleep = f.sleep_drops_weights
        if sleep is not None and step >= sleep.from_step:
            # Woken from sleep, the engine reloads the weights it was first given.
            report = self.inner.load_weights(self.first_weights, version, verify)
        return report


def wrap_rollout(engine: RolloutEngine, faults: FaultsConfig, step: StepFn) -> RolloutEngine:
    if all(x is None for x in (faults.unscaled_logprobs, faults.straggler,
                               faults.skip_weight_sync, faults.sleep_drops_weights,
                               faults.sync_hang, faults.importance_collapse,
                               faults.no_stop)):
        return engine
    return FaultyRollout(engine, faults, step)


# --------------------------------------------------------------------------- learner

def resets_version(faults: FaultsConfig, step: int) -> bool:
    """version_reset: after this step's update the learner's counter restarts at 1."""
    return faults.version_reset is not None and step == faults.version_reset.at_step


@torch.no_grad()
def sharpen_policy(policy: torch.nn.Module, faults: FaultsConfig, step: int) -> None:
    """entropy_collapse: after the update of its step, the output head's weights (so the
    logits) are multiplied by its factor; the next sync carries the sharper policy."""
    collapse = faults.entropy_collapse
    if collapse is not None and step == collapse.at_step:
        policy.get_output_embeddings().weight.mul_(collapse.factor)


# --------------------------------------------------------------------------- reward

class SlowReward:
    """The reward stage takes ``seconds`` longer each step from ``from_step`` on: a plain
    scorer in verdicts(), a streaming pool in collect() (its part after generation ends), so
    a pool keeps streaming and reporting its metrics under the fault."""

    def __init__(self, inner, seconds: float, from_step: int, step: StepFn):
        self.inner, self.seconds, self.from_step, self.step = inner, seconds, from_step, step

    def __getattr__(self, name):          # streaming, submit, metrics, close, ...
        return _delegate(self, name)

    def _delay(self) -> None:
        if self.step() >= self.from_step:
            time.sleep(self.seconds)

    def verdicts(self, problems, texts, finished):
        self._delay()
        return self.inner.verdicts(problems, texts, finished)

    def score(self, problems, texts, finished) -> list[float]:
        return [v.reward for v in self.verdicts(problems, texts, finished)]

    def collect(self, n: int):
        self._delay()
        return self.inner.collect(n)


def wrap_reward(reward, faults: FaultsConfig, step: StepFn):
    slow = faults.slow_reward
    return reward if slow is None else SlowReward(reward, slow.seconds, slow.from_step, step)


class FaultyEnv:
    """A multi-turn task's environment whose calls (reset and step), from a step of the run
    on, first sleep (slow_env) or raise (env_error); the rest is the environment's own."""

    def __init__(self, inner, slow: SlowEnvFault | None, error: EnvErrorFault | None,
                 step: StepFn):
        self.inner, self.slow, self.error, self.step_of_run = inner, slow, error, step

    def __getattr__(self, name):          # draw, close, stop, demonstration, ...
        return _delegate(self, name)

    def _misbehave(self) -> None:
        if self.slow is not None and self.step_of_run() >= self.slow.from_step:
            time.sleep(self.slow.seconds)
        if self.error is not None and self.step_of_run() >= self.error.from_step:
            raise RuntimeError("faults.env_error: the environment's call raised")

    def reset(self, row):
        self._misbehave()
        return self.inner.reset(row)

    def step(self, text: str):
        self._misbehave()
        return self.inner.step(text)


def wrap_env(env, faults: FaultsConfig, step: StepFn):
    if faults.slow_env is None and faults.env_error is None:
        return env
    return FaultyEnv(env, faults.slow_env, faults.env_error, step)


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


# --------------------------------------------------------------------------- data

def skipped_on_resume(faults: FaultsConfig) -> int:
    """skip_on_resume: prompts a resumed run's data stream passes over (0: none); the
    ledger restored from the checkpoint sees the gap (engine.orchestration.ledger)."""
    return 0 if faults.skip_on_resume is None else faults.skip_on_resume.prompts


# --------------------------------------------------------------------------- workers

def dies_at(faults: FaultsConfig, step: int) -> None:
    """kill_rollout_worker: a rollout worker taking a generation call of its step SIGKILLs
    its own process (no cleanup, no reply: Ray reports the actor dead to its callers)."""
    kill = faults.kill_rollout_worker
    if kill is not None and step == kill.at_step:
        os.kill(os.getpid(), signal.SIGKILL)


def for_replacement(cfg: RunConfig) -> RunConfig:
    """The config of a worker that replaces a dead one: a fault rehearses one death, so
    the replacement runs without kill_rollout_worker."""
    if cfg.faults.kill_rollout_worker is None:
        return cfg
    faults = cfg.faults.model_copy(update={"kill_rollout_worker": None})
    return cfg.model_copy(update={"faults": faults})
