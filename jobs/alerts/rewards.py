"""The rules about the reward itself: RewardErrors (the reward function raising) and
RewardOverOptimization (a rising reward the verifier or held-out reward does not follow).
Registered in jobs/alerts/rules.py's RULES."""

from __future__ import annotations

import statistics

from engine.api import metrics as M
from jobs.alerts.evidence import chart, slope
from jobs.alerts.history import Finding, RunFacts, RunHistory, Thresholds
from jobs.alerts.inputs import reads
from jobs.alerts.knobs import lever


@reads(metrics=(M.REWARD_ERROR_FRAC,))
def reward_errors(h: RunHistory, f: RunFacts, t: Thresholds, now: float) -> list[Finding]:
    pts = h.last(M.REWARD_ERROR_FRAC, 1)
    if not pts or pts[0][1] <= t.reward_error_frac:
        return []
    step, frac = pts[0]
    return [Finding(
        kind="RewardErrors", key="RewardErrors", step=step,
        cause=(f"The reward function failed on {frac:.0%} of step {step}'s samples (raised "
               f"or returned a non-number; each scored 0 with reason reward_error), over "
               f"the {t.reward_error_frac:.0%} threshold: the policy is learning from "
               f"zeros, not from your reward."),
        runbook=(("Read the reward function's errors in the run's log and fix the function: "
                  "a sample it fails on teaches the policy nothing.") if f.is_external else
                 ("Read the traceback in the run's log (each distinct error is logged once) "
                  "and fix the function reward.function names: its signature is "
                  "fn(prompt, completion, answer, **row) -> float, and row holds the "
                  "dataset's other columns. reward/python/reward_error counts the failures.")),
        evidence={"values": {M.REWARD_ERROR_FRAC: frac, "threshold": t.reward_error_frac},
                  "series": chart(h, M.REWARD_ERROR_FRAC)})]


AGREEMENT_STEPS = 3   # RewardOverOptimization averages the RM-verifier agreement over these
HELDOUT_EVALS = 4     # ... and fits the held-out reward over its last this-many evaluations


def rise(points: list[tuple[int, float]]) -> float:
    """How much a series rose over its steps, by its least-squares slope."""
    return slope(points) * (points[-1][0] - points[0][0]) if len(points) > 1 else 0.0


@reads(metrics=(M.REWARD_MEAN,), any_of=(M.REWARD_VERIFIER_MEAN, M.EVAL_REWARD_MEAN,
                                        M.REWARD_RM_VS_VERIFIER_AGREEMENT))
def reward_over_optimization(h: RunHistory, f: RunFacts, t: Thresholds,
                             now: float) -> list[Finding]:
    """The training reward keeps rising while what it stands for does not: the verifier
    scoring the same samples alongside (a reward model run), or the held-out reward; or
    the reward model and the verifier disagree on most samples."""
    train = h.last(M.REWARD_MEAN, t.overopt_window)
    verifier = h.last(M.REWARD_VERIFIER_MEAN, t.overopt_window)
    held = h.last(M.EVAL_REWARD_MEAN, HELDOUT_EVALS)
    agreement = h.last(M.REWARD_RM_VS_VERIFIER_AGREEMENT, AGREEMENT_STEPS)
    causes, values, other = [], {}, None
    if len(train) == len(verifier) == t.overopt_window:
        # the same samples scored twice, so no sampling noise between the two: a
        # training reward that holds while the verifier falls counts as well
        up, follow = rise(train), rise(verifier)
        if up >= 0 and up - follow >= t.overopt_min_rise and follow < t.overopt_follow * up:
            causes.append(f"over the last {len(train)} steps the training reward moved "
                          f"{up:+.3f} while the verifier scoring the same samples moved "
                          f"{follow:+.3f}")
            values.update({"reward_rise": up, "verifier_rise": follow})
            other = chart(h, M.REWARD_VERIFIER_MEAN)
    if len(held) == HELDOUT_EVALS:
        span = [p for p in h.series(M.REWARD_MEAN) if held[0][0] <= p[0] <= held[-1][0]]
        up, follow = rise(span), rise(held)
        if len(span) >= 3 and up >= t.overopt_min_rise and follow < t.overopt_follow * up:
            causes.append(f"from step {held[0][0]} to {held[-1][0]} the training reward rose "
                          f"by {up:+.3f} while the held-out reward moved {follow:+.3f}")
            values.update({"reward_rise_heldout_span": up, "heldout_rise": follow})
            other = other or chart(h, M.EVAL_REWARD_MEAN)
    if len(agreement) == AGREEMENT_STEPS:
        mean = statistics.fmean(v for _, v in agreement)
        if mean < t.overopt_agreement_min:
            causes.append(f"the reward model agrees with the verifier on only {mean:.0%} of "
                          f"the last {AGREEMENT_STEPS} steps' samples (threshold "
                          f"{t.overopt_agreement_min:.0%})")
            values["rm_vs_verifier_agreement"] = mean
            other = other or chart(h, M.REWARD_RM_VS_VERIFIER_AGREEMENT)
    if not causes:
        return []
    if f.is_external:
        runbook = ("Raise " + lever(f.framework, "kl_coef", "the KL penalty to the reference")
                   + " to hold the policy near the reference, or stop at the last checkpoint "
                   "before the split; with a learned reward retrain or enlarge the reward "
                   "model on the policy's own samples, or score with a verifier instead; keep "
                   "a verifier alongside and held-out evaluation so the split stays visible.")
    else:
        alg, reward = f.config.algorithm, f.config.reward
        runbook = (f"Raise algorithm.kl_coef (now {alg.kl_coef:g}) to hold the policy near "
                   f"the reference, or stop at the last checkpoint before the split; with a "
                   f"learned reward (reward.type = {reward.type!r}) retrain or enlarge the "
                   "reward model on the policy's own samples, or score with a verifier "
                   "instead; keep a verifier alongside (reward/verifier_mean) and held-out "
                   "evaluation (telemetry.eval_every_steps) so the split stays visible.")
    return [Finding(
        kind="RewardOverOptimization", key="RewardOverOptimization", step=train[-1][0],
        cause=("The policy is optimizing the reward, not the task: " + "; ".join(causes)
               + "."),
        runbook=runbook,
        evidence={"values": values, "series": chart(h, M.REWARD_MEAN), "compare": other})]
