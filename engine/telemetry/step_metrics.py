"""A step's metrics from what the step produced: pure functions the loop calls.

    m = learner.update(...)                         learner/*, logprob_gap/*, tis/*
    m |= tel.step_metrics(t0, t1)                   time/*, bubble, rollout_share, device/*
    m |= sample_metrics(samples, staleness)         reward/*, response_length/*, staleness/*
    m |= throughput_metrics(samples, m)             tokens and samples per second
    m |= group_metrics(groups, dropped)             samples/zero_std_group_frac, /resampled
    m |= group_length_metrics(groups)               response_length/group_max_mean
    m |= sync_metrics(last_sync)                    weight_sync/*

Canonical names are in DESIGN.md section 4.
"""

from __future__ import annotations

import statistics

import numpy as np

from engine.experience import Sample, zero_variance
from engine.weightsync.base import SyncResult


def percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs, dtype=np.float64), q))


LENGTH_QUANTILES = (10, 25, 50, 75, 90, 95, 99)


def sample_metrics(samples: list[Sample], staleness: list[int]) -> dict[str, float]:
    rewards = [s.reward for s in samples]
    lengths = [len(s.response_ids) for s in samples]
    timed = [s.gen_s for s in samples if s.gen_s is not None]
    # Generation time per sample (its call's start -> its completion): p99 far above p50
    # is a straggler whatever the policy, where step shares blur under overlap.
    gen = ({"rollout/gen_s_p50": percentile(timed, 50), "rollout/gen_s_p99": percentile(timed, 99),
            "rollout/gen_s_max": max(timed)} if timed else {})
    return gen | {
        "reward/mean": statistics.fmean(rewards),
        "reward/std": statistics.pstdev(rewards),
        "reward/accuracy": sum(r == 1.0 for r in rewards) / len(rewards),
        "response_length/mean": statistics.fmean(lengths),
        "response_length/min": float(min(lengths)),
        # The distribution's shape, for the planner (engine.planner.fit): the long tail
        # is what decides what overlapping and cutting generation can buy.
        **{f"response_length/p{q}": percentile(lengths, q) for q in LENGTH_QUANTILES},
        "response_length/max": float(max(lengths)),
        "response/finished_frac": sum(s.finished for s in samples) / len(samples),
        "response/truncated_frac": sum(not s.finished for s in samples) / len(samples),
        "staleness/mean": statistics.fmean(staleness),
        "staleness/max": float(max(staleness)),
        "samples/mixed_versions": float(sum(s.mixes_versions for s in samples)),
    }


def group_metrics(groups: list[list[Sample]], dropped: int) -> dict[str, float]:
    """``groups``: the step's batch; ``dropped``: the groups dynamic sampling dropped to
    fill it (every one of them flat). The zero-std fraction is over every group the step
    drew, so it shows how flat the signal is whether or not dynamic sampling hides it from
    the learner; resampled is the extra generation that cost, in samples."""
    flat = sum(zero_variance(g) for g in groups) + dropped
    group_size = len(groups[0])
    return {
        "samples/zero_std_group_frac": flat / (len(groups) + dropped),
        "samples/resampled": float(dropped * group_size),
    }


def group_length_metrics(groups: list[list[Sample]]) -> dict[str, float]:
    """How alike a prompt's rows are in length (a group completes with its longest row):
    the mean over groups of their longest response, next to response_length/mean."""
    return {"response_length/group_max_mean": statistics.fmean(
        max(len(s.response_ids) for s in g) for g in groups)}


def throughput_metrics(samples: list[Sample], phases: dict[str, float]) -> dict[str, float]:
    """``phases``: the step's time/* metrics (tel.step_metrics)."""
    tokens = sum(len(s.response_ids) for s in samples)
    return {
        "throughput/tokens_per_s": tokens / phases["time/step_s"],
        "throughput/samples_per_s": len(samples) / phases["time/step_s"],
        "rollout/tokens_per_s": tokens / max(phases["time/rollout_s"], 1e-9),
    }


def sync_metrics(res: SyncResult) -> dict[str, float]:
    """The latest settled sync (under an overlapped policy, possibly the last step's)."""
    return {
        "weight_sync/latency_s": res.latency_s,
        "weight_sync/bytes": float(res.bytes),
        "weight_sync/gb_per_s": res.gb_per_s,
        "weight_sync/version_learner": float(res.version_learner),
        "weight_sync/version_rollout": float(res.version_rollout),
        "weight_sync/matched": float(res.matched),
        "weight_sync/verified": float(res.verified),
        "weight_sync/wire_bytes": float(res.wire_bytes or res.bytes),
        **({"weight_sync/delta_density": res.changed_frac}
           if res.changed_frac is not None else {}),
    }
