"""The rollout seam: what the RL loop needs from an inference engine.

    engine = build_rollout(cfg.rollout, model_dir)      # "torch" or "vllm"
    out = engine.generate(prompt_ids, params, seed)     # ids + behaviour logprobs
    out = engine.generate(prompt_ids, params, seed, on_complete=cb)
        # cb(i, completion) as soon as prompt i ends (streaming: score while others run);
        # cb returning True stops the call: rows still running come back aborted=True
    report = engine.load_weights(named_tensors, version)  # -> version + fingerprint served
    engine.sleep() ... learner trains ... engine.wake_up()   # colocated: share the device

It does not need to know how or where generation runs. Behaviour logprobs are always of
the distribution actually sampled from: logits / temperature, then top-p renormalized.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 16
    ignore_eos: bool = False  # benchmarks force equal lengths with this (stop ids too)
    # Ids that end a completion besides the model's EOS: the chat template's end-of-turn
    # token (engine.model.stop_token_ids). The stop token is kept and counts as finished.
    stop_token_ids: tuple[int, ...] = ()
    # The caller continues these contexts in a later call (a multi-turn trajectory's next
    # turn): an engine whose prefix cache is its own (the torch sampler's) keeps their KV
    # for it; vLLM's keeps blocks whatever this says. Both count these calls' contexts in
    # prefix_stats (rollout/prefix_hit_frac).
    continues: bool = False


@dataclass
class Completion:
    token_ids: list[int]          # generated ids, EOS included when it was sampled
    logprobs: list[float]         # one per token, under the sampling distribution used
    finished: bool                # True when EOS / a stop id ended it, False: the budget
    version: int                  # policy version that generated it
    aborted: bool = False         # cut short by an on_complete stop (partial rollout)
    # rollout.record_routing: the experts each MoE layer chose for every token the engine
    # fed, prompt then generated tokens but the last: (len(prompt) + len(token_ids) - 1,
    # L, k) int16 (engine.moe)
    routing: np.ndarray | None = None


@dataclass(frozen=True)
class WeightReport:
    """What a rollout engine says after loading weights: the receiver's own view."""
    version: int
    fingerprint: str
    bytes: int
    extra: dict = field(default_factory=dict)


OnComplete = Callable[[int, "Completion"], "bool | None"]
"""Called once per prompt index as its completion ends (EOS or budget), in finishing
order; a True return stops generation and the rows still running come back aborted."""


class PrefixTokens:
    """The prefix-cache counts an engine keeps for rollout/prefix_hit_frac: of the
    contexts of the calls that said they will be continued (SamplingParams.continues),
    the tokens its prefix cache served and the tokens in all."""

    def __init__(self) -> None:
        self._prefix_tokens = (0, 0)

    def _counted(self, served: int, total: int) -> None:
        s, t = self._prefix_tokens
        self._prefix_tokens = (s + served, t + total)

    def prefix_stats(self) -> tuple[int, int]:
        """(served, in all) since the last call."""
        stats, self._prefix_tokens = self._prefix_tokens, (0, 0)
        return stats


class RolloutEngine(Protocol):
    def generate(self, prompts: list[list[int]], params: SamplingParams, seed: int,
                 on_complete: OnComplete | None = None,
                 budgets: list[int] | None = None) -> list[Completion]:
        """``budgets``: each row's own cap on new tokens (<= params.max_new_tokens; a
        continued partial rollout has only what its row has left), reached = completed."""
        ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]],
                     version: int, verify: bool = True) -> WeightReport:
        """Load, take ``version``, report it with the fingerprint of what the engine now
        serves ("" when not ``verify``: weight_sync.verify_every skipped this sync)."""
        ...

    def weight_version(self) -> int: ...

    def fingerprint(self) -> str: ...

    def sleep(self) -> bool:
        """Colocated placement: release device memory while the learner trains. True
        when something was released; wake_up (or the next load_weights) takes it back."""
        ...

    def wake_up(self) -> None: ...
