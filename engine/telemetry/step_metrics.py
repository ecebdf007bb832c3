"""A step's metrics from what the step produced: pure functions the loop calls.

    m = learner.update(...)                         learner/*, logprob_gap/*, tis/*
    m |= tel.step_metrics(t0, t1)                   time/*, bubble, rollout_share, device/*
    m |= sample_metrics(samples, staleness)         reward/*, response_length/*, staleness/*
    m |= throughput_metrics(samples, m)             tokens and samples per second
    m |= group_metrics(groups, dropped)             samples/zero_std_group_frac, /resampled
    m |= group_length_metrics(groups)               response_length/group_max_mean
    m |= sync_metrics(last_sync)                    weight_sync/*
    m |= env_metrics(samples)                       env/* (a multi-turn task's trajectories)

The names, units and meanings are in engine/metrics.py.
"""

from __future__ import annotations

import statistics

import numpy as np

from engine import metrics as M
from engine.experience import EnvTrace, Sample, zero_variance
from engine.weightsync.base import SyncResult


def percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q))


LENGTH_QUANTILES = M.LENGTH_QUANTILES


def repetition(ids: list[int], n: int = M.REPETITION_NGRAM) -> float:
    """Share of a response's n-grams that repeat an earlier n-gram of it: 0 for text that
    never repeats itself, near 1 for a loop ("the the the ..."); 0 under n + 1 tokens."""
    grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if len(grams) > 1 else 0.0


def sample_metrics(samples: list[Sample], staleness: list[int]) -> dict[str, float]:
    rewards = [s.reward for s in samples]
    lengths = [len(s.response_ids) for s in samples]
    timed = [s.gen_s for s in samples if s.gen_s is not None]
    # Generation time per sample (its call's start -> its completion): p99 far above p50
    # is a straggler whatever the policy, where step shares blur under overlap.
    gen = ({M.ROLLOUT_GEN_S_P50: percentile(timed, 50), M.ROLLOUT_GEN_S_P99: percentile(timed, 99),
            M.ROLLOUT_GEN_S_MAX: max(timed)} if timed else {})
    return gen | {
        M.REWARD_MEAN: statistics.fmean(rewards),
        M.REWARD_STD: statistics.pstdev(rewards),
        M.REWARD_MIN: min(rewards),
        M.REWARD_MAX: max(rewards),
        M.REWARD_ACCURACY: sum(r == 1.0 for r in rewards) / len(rewards),
        M.RESPONSE_LENGTH_MEAN: statistics.fmean(lengths),
        M.RESPONSE_LENGTH_MIN: float(min(lengths)),
        # The distribution's shape, for the planner (engine.planner.fit): the long tail
        # is what decides what overlapping and cutting generation can buy.
        **{M.RESPONSE_LENGTH_QUANTILE[q]: percentile(lengths, q) for q in LENGTH_QUANTILES},
        M.RESPONSE_LENGTH_MAX: float(max(lengths)),
        M.RESPONSE_FINISHED_FRAC: sum(s.finished for s in samples) / len(samples),
        M.RESPONSE_TRUNCATED_FRAC: sum(not s.finished for s in samples) / len(samples),
        M.RESPONSE_REPETITION: statistics.fmean(repetition(s.response_ids) for s in samples),
        M.STALENESS_MEAN: statistics.fmean(staleness),
        M.STALENESS_MAX: float(max(staleness)),
        M.SAMPLES_MIXED_VERSIONS: float(sum(s.mixes_versions for s in samples)),
    }


def env_metrics(samples: list[Sample], closes: EnvTrace | None = None) -> dict[str, float]:
    """env/* over the step's trajectories; {} when they had no environment. ``closes``:
    the failed closes of trajectories that trained on nothing (dropped while carried),
    counted in env/errors and env/timeouts."""
    traces = [s.env for s in samples if s.env is not None]
    if not traces:
        return {}
    turns = [t.turns for t in traces]
    counted = [*traces, closes or EnvTrace()]
    calls = [x for t in traces for x in t.step_s] or [0.0]
    return {M.ENV_TURNS_MEAN: statistics.fmean(turns), M.ENV_TURNS_MAX: float(max(turns)),
            M.ENV_STEP_S_P50: percentile(calls, 50), M.ENV_STEP_S_P99: percentile(calls, 99),
            M.ENV_ERRORS: float(sum(t.errors for t in counted)),
            M.ENV_TIMEOUTS: float(sum(t.timeouts for t in counted)),
            M.ENV_TOOL_CALLS: float(sum(t.tool_calls for t in traces))}


def group_metrics(groups: list[list[Sample]], dropped: int) -> dict[str, float]:
    """``groups``: the step's batch; ``dropped``: the groups dynamic sampling dropped to
    fill it (every one of them flat). The zero-std fraction is over every group the step
    drew, so it shows how flat the signal is whether or not dynamic sampling hides it from
    the learner; resampled is the extra generation that cost, in samples."""
    flat = sum(zero_variance(g) for g in groups) + dropped
    group_size = len(groups[0])
    return {
        M.SAMPLES_ZERO_STD_GROUP_FRAC: flat / (len(groups) + dropped),
        M.SAMPLES_RESAMPLED: float(dropped * group_size),
    }


def group_length_metrics(groups: list[list[Sample]]) -> dict[str, float]:
    """How alike a prompt's rows are in length (a group completes with its longest row):
    the mean over groups of their longest response, next to response_length/mean."""
    return {M.RESPONSE_LENGTH_GROUP_MAX_MEAN: statistics.fmean(
        max(len(s.response_ids) for s in g) for g in groups)}


def throughput_metrics(samples: list[Sample], phases: dict[str, float]) -> dict[str, float]:
    """``phases``: the step's time/* metrics (tel.step_metrics)."""
    tokens = sum(len(s.response_ids) for s in samples)
    return {
        M.THROUGHPUT_TOKENS_PER_S: tokens / phases[M.TIME_STEP_S],
        M.THROUGHPUT_SAMPLES_PER_S: len(samples) / phases[M.TIME_STEP_S],
        M.ROLLOUT_TOKENS_PER_S: tokens / max(phases[M.TIME_ROLLOUT_S], 1e-9),
    }


def sync_metrics(res: SyncResult) -> dict[str, float]:
    """The latest settled sync (under an overlapped policy, possibly the last step's)."""
    return {
        M.WEIGHT_SYNC_LATENCY_S: res.latency_s,
        M.WEIGHT_SYNC_BYTES: float(res.bytes),
        M.WEIGHT_SYNC_GB_PER_S: res.gb_per_s,
        M.WEIGHT_SYNC_VERSION_LEARNER: float(res.version_learner),
        M.WEIGHT_SYNC_VERSION_ROLLOUT: float(res.version_rollout),
        M.WEIGHT_SYNC_MATCHED: float(res.matched),
        M.WEIGHT_SYNC_VERIFIED: float(res.verified),
        M.WEIGHT_SYNC_WIRE_BYTES: float(res.wire_bytes or res.bytes),
        **({M.WEIGHT_SYNC_DELTA_DENSITY: res.changed_frac}
           if res.changed_frac is not None else {}),
    }
