"""What the planner needs to know about a run: its shape and its costs.

    PlanInputs      the recipe (prompts, group size, budget), the response-length
                    distribution and the fitted costs of each phase, per device
    LengthModel     response lengths as an inverse CDF (quantile -> tokens), with the
                    share of a group's rows that follow the group's own draw (rows of one
                    prompt tend to be alike: a long answer is long for every sample)

Filled by ``engine.planner.fit`` from a run's events, or by hand (``load_inputs`` reads
the same fields from TOML). Plain Python + numpy: no torch, no Ray.
"""

from __future__ import annotations

import itertools
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class LengthModel:
    quantiles: tuple[float, ...]      # increasing, from 0.0 to 1.0
    lengths: tuple[float, ...]        # tokens at each quantile, non-decreasing
    group_corr: float = 0.0           # share of a group's rows drawn at the group's quantile
    curve: float = 1.0                # within each quantile interval, lengths rise as t^curve
                                      # (1: linear; above 1 the interval's mass sits low,
                                      # as in a long tail, where linear overstates the mean)

    def __post_init__(self) -> None:
        q, ln = self.quantiles, self.lengths
        if len(q) != len(ln) or len(q) < 2:
            raise ValueError("lengths: quantiles and lengths need the same length (>= 2)")
        if q[0] != 0.0 or q[-1] != 1.0 or any(b <= a for a, b in itertools.pairwise(q)):
            raise ValueError("lengths.quantiles must rise strictly from 0.0 to 1.0")
        if any(b < a for a, b in itertools.pairwise(ln)) or ln[0] < 0:
            raise ValueError("lengths.lengths must be >= 0 and non-decreasing")
        if not 0.0 <= self.group_corr <= 1.0:
            raise ValueError("lengths.group_corr must be in [0, 1]")
        if not 0.05 <= self.curve <= 20.0:
            raise ValueError("lengths.curve must be in [0.05, 20]")

    def tokens_at(self, u: np.ndarray) -> np.ndarray:
        """The inverse CDF: the length at quantile ``u``."""
        q, ln = np.asarray(self.quantiles), np.asarray(self.lengths)
        i = np.clip(np.searchsorted(q, u, side="right") - 1, 0, len(q) - 2)
        t = (u - q[i]) / (q[i + 1] - q[i])
        return ln[i] + (ln[i + 1] - ln[i]) * t ** self.curve

    @property
    def mean(self) -> float:
        q, ln = np.asarray(self.quantiles), np.asarray(self.lengths)
        return float(np.sum(np.diff(q) * (ln[:-1] + np.diff(ln) / (self.curve + 1))))

    def sample_groups(self, rng: np.random.Generator, groups: int, size: int,
                      budget: int) -> np.ndarray:
        """(groups, size) response lengths in tokens, each in [1, budget]."""
        u_group = rng.random((groups, 1))
        own = rng.random((groups, size)) < self.group_corr
        u = np.where(own, u_group, rng.random((groups, size)))
        return np.clip(np.rint(self.tokens_at(u)), 1, budget).astype(np.int64)


@dataclass(frozen=True)
class PlanInputs:
    """A run's shape and fitted costs. Costs are seconds on one device of the kind the run
    used; a phase spread over k devices is assumed to take 1/k of its per-token part."""

    prompts_per_step: int
    group_size: int
    max_new_tokens: int
    lengths: LengthModel
    prefill_s: float              # per generate call
    decode_step_s: float          # per decode step of a call (whatever its rows)
    decode_row_s: float           # per active row per decode step: the batch's token cost
    reward_sample_s: float        # per scored sample
    learner_step_s: float         # per update, fixed
    learner_token_s: float        # per trained response token, on one learner device
    sync_send_s: float            # per sync, on the learner's side (the driver waits)
    sync_recv_s: float            # per sync, on each rollout worker (queued before its
                                  # next call), overhead
    sync_bytes: float = 0.0       # bytes sent per sync
    sync_byte_s: float = 0.0      # seconds per byte on each receiver
    # per generate call of a multi-turn task (task.type "env"): its environment calls, a
    # reset and a step after each turn, each round concurrent over the call's rows (so
    # neither more workers nor fewer rows per worker shorten it)
    env_call_s: float = 0.0
    # how much slower the learner / a rollout worker runs while the other side computes
    # too (1: not at all): CPU devices of one host share its caches, memory bandwidth and
    # clock (engine.telemetry.contention's probe, host/corun_slowdown/*)
    corun_learner: float = 1.0
    corun_rollout: float = 1.0

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, int | float) and v < 0:
                raise ValueError(f"{f.name} must be >= 0 (got {v})")
        if self.prompts_per_step < 1 or self.group_size < 1 or self.max_new_tokens < 1:
            raise ValueError("prompts_per_step, group_size and max_new_tokens must be >= 1")

    def generate_s(self, steps: float, tokens: float) -> float:
        """One generate call that runs ``steps`` decode steps producing ``tokens``."""
        return self.prefill_s + self.decode_step_s * steps + self.decode_row_s * tokens

    def learner_s(self, tokens: float, devices: int) -> float:
        return self.learner_step_s + self.learner_token_s * tokens / devices

    @property
    def recv_s(self) -> float:
        return self.sync_recv_s + self.sync_byte_s * self.sync_bytes


def load_inputs(path: Path) -> PlanInputs:
    """PlanInputs from a TOML file: the fields above at top level and a ``[lengths]``
    table (quantiles, lengths, group_corr)."""
    data = tomllib.loads(Path(path).read_text())
    if "lengths" not in data:
        raise ValueError(f"{path}: a [lengths] table (quantiles, lengths) is required")
    known = {f.name for f in fields(PlanInputs)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"{path}: unknown fields {sorted(unknown)}; known: {sorted(known)}")
    lengths = data.pop("lengths")
    return PlanInputs(lengths=LengthModel(tuple(lengths.pop("quantiles")),
                                          tuple(lengths.pop("lengths")), **lengths), **data)
