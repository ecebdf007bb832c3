"""The alert rules: pure functions over a run's history, one per failure mode.

    findings = evaluate(history, facts, thresholds, now)      # every rule, in RULES order

A rule returns the findings that hold now (usually zero or one); a condition that no
longer holds simply is not returned, and the lifecycle resolves its alert. Rules that
depend on time passing (PhaseHang, StoppedReporting) read ``now``; the periodic task
evaluates them even when no event arrives. Every finding carries its evidence: the values
and the series that triggered it, small enough for a chart.

The rules about what the policy writes (importance weights, entropy, length) live in
jobs/alerts/outputs.py, ThroughputRegression in jobs/alerts/throughput.py, DataIntegrity
(the data ledger's gaps and repeats) in jobs/alerts/data.py, the reward rules in
jobs/alerts/rewards.py, BubbleHigh and ResyncSlow (where a step's time goes) in
jobs/alerts/bubble.py, EnvErrors and EnvHang (a multi-turn task's environment) in
jobs/alerts/envs.py.

Each rule declares what it reads (``@reads``, jobs/alerts/inputs.py). On an external run
(TRL, veRL, ...) a rule whose inputs the run lacks is skipped, and the pages say so
(jobs/alerts/coverage.py); one that has them runs as on a native run, with a runbook
that names the framework's knobs (jobs/alerts/knobs.py) instead of RunConfig fields.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from engine.api import metrics as M
from engine.config import FRAMEWORK_LABELS
from jobs.alerts.bubble import bubble_high, resync_slow
from jobs.alerts.data import data_integrity
from jobs.alerts.envs import env_errors, env_hang
from jobs.alerts.evidence import chart, slope
from jobs.alerts.history import Finding, RunFacts, RunHistory, Thresholds
from jobs.alerts.inputs import missing, reads
from jobs.alerts.knobs import lever
from jobs.alerts.outputs import (
    entropy_collapse,
    importance_weight_collapse,
    length_blowup,
    non_termination,
)
from jobs.alerts.rewards import reward_errors, reward_over_optimization
from jobs.alerts.throughput import throughput_regression

Rule = Callable[[RunHistory, RunFacts, Thresholds, float], list[Finding]]


@reads(events=("weight_sync.report",))
def weight_sync_desync(h: RunHistory, f: RunFacts, t: Thresholds, now: float) -> list[Finding]:
    if not h.syncs:
        return []
    s = h.syncs[-1]
    lag = s.version_learner - s.version_rollout
    # weight_sync.verify_every skips fingerprints: an unverified sync (its fingerprints
    # are "") neither shows a mismatch nor clears one; the newest verified sync decides
    checked = next((x for x in reversed(h.syncs) if x.verified), None)
    if checked is not None and checked.version_learner == checked.version_rollout and \
            checked.fingerprint_learner != checked.fingerprint_rollout:
        cause = (f"The rollout engine reports version {checked.version_rollout} but serves "
                 f"other weights than the learner's (fingerprint "
                 f"{checked.fingerprint_rollout[:12]} vs {checked.fingerprint_learner[:12]}): "
                 f"the generator is not receiving new weights.")
        if checked is not s:
            cause += (f" The syncs since (to v{s.version_learner}) were not verified "
                      f"(weight_sync.verify_every).")
        s = checked
    elif lag > t.desync_version_lag:
        cause = (f"The rollout engine serves version {s.version_rollout}, {lag} behind the "
                 f"learner's {s.version_learner}: the generator is not receiving new weights.")
    else:
        return []
    since = s.step             # the first sync of the current desync (events come batched)
    for prior in reversed(h.syncs[:h.syncs.index(s)]):
        if prior.matched:
            break
        since = prior.step
    return [Finding(
        kind="WeightSyncDesync", key="WeightSyncDesync", step=since, cause=cause,
        runbook=("Check that the weight sync really loads tensors into the engine (sleep/wake "
                 "mode, a transport that returns before applying, a swallowed error in the "
                 "receiver); compare weight_sync.report fingerprints per worker."
                 + ("" if f.is_external else
                    f" Change weight_sync.type (now {f.config.weight_sync.type!r}) to "
                    "another transport to isolate it.")),
        evidence={"values": {k: getattr(s, k) for k in (
                      "version_learner", "version_rollout", "fingerprint_learner",
                      "fingerprint_rollout")},
                  "series": chart(h, M.WEIGHT_SYNC_MATCHED)})]


@reads(metrics=(M.REWARD_MEAN,), any_of=(M.SAMPLES_ZERO_STD_GROUP_FRAC, M.REWARD_STD))
def stuck_reward(h: RunHistory, f: RunFacts, t: Thresholds, now: float) -> list[Finding]:
    pts = h.last(M.REWARD_MEAN, t.stuck_window)
    if len(pts) < t.stuck_window or abs(slope(pts)) >= t.stuck_slope:
        return []
    first = pts[0][0]
    window = [s for s in h.syncs if s.step >= first]
    versions = [s.version_rollout for s in window]
    gaps = [v for s, v in h.series(M.LOGPROB_GAP_MEAN) if s >= first]
    if any(s.verified and s.fingerprint_learner != s.fingerprint_rollout for s in window) or \
            (len(versions) > 1 and max(versions) == min(versions)):
        key, why = "weights", "the generator is not receiving new weights"
        fix = "see WeightSyncDesync: check the weight sync and the fingerprints per worker"
    elif gaps and statistics.fmean(gaps) > t.gap_high:
        key, why = "behaviour", "the behaviour policy differs from the learner"
        fix = ("check logprob_gap and tis/clip_frac: temperature scaling of the engine's "
               "logprobs, staleness " + ("(how far generation runs ahead)" if f.is_external
                                         else "(async_policy)")
               + ", engine numerics " + ("(the inference engine's dtype)" if f.is_external
                                         else "(model.dtype)"))
    elif flat_signal(h, t) and f.is_external:
        key, why = "signal", "learning signal is flat (check reward variance / advantages)"
        fw = f.framework
        fix = ("check the share of groups whose rewards all agree and the reward's std: such "
               "a group has zero advantages; raise "
               + lever(fw, "group_size", "the completions per prompt") + ", "
               + lever(fw, "temperature", "the sampling temperature")
               + " or task difficulty, or "
               + lever(fw, "filter_groups", "train only on groups whose rewards differ"))
    elif flat_signal(h, t):
        key, why = "signal", "learning signal is flat (check reward variance / advantages)"
        alg = f.config.algorithm
        fix = ("check samples/zero_std_group_frac, reward/std and reward/accuracy: a group "
               "whose rewards all agree has zero advantages; raise algorithm.group_size "
               f"(now {alg.group_size}), rollout.temperature (now "
               f"{f.config.rollout.temperature:g}) or task difficulty"
               + ("" if getattr(alg, "dynamic_sampling", False) else
                  ", or set algorithm.dynamic_sampling = true to train only on groups "
                  "that differ")
               + path_model_levers(f.config))
    else:
        return []   # rewards still vary: slow learning, not a stuck run
    values = {"slope": slope(pts), "window": len(pts)}
    if flat := h.last(M.SAMPLES_ZERO_STD_GROUP_FRAC, t.stuck_window):
        values["zero_std_group_frac"] = statistics.fmean(v for _, v in flat)
    return [Finding(
        kind="StuckReward", key=f"StuckReward:{key}", step=pts[-1][0],
        cause=f"Reward has been flat for {len(pts)} steps (slope {slope(pts):+.4f}/step): {why}.",
        runbook=fix[0].upper() + fix[1:] + ".",
        evidence={"values": values, "series": chart(h, M.REWARD_MEAN)})]


def path_model_levers(cfg) -> str:
    """What matters first for a model.path model whose signal is flat (the README's
    recipe for one, measured): whether it writes answers the reward can tell apart at
    all, then its learning rates."""
    if cfg.model.path is None:
        return ""
    return (f"; for a model.path model first warm_start.steps (now {cfg.warm_start_steps}): "
            "one that never writes a well-formed answer has nothing to reinforce (the "
            "README's recipe: 120 steps at batch 32, warm_start.lr 1e-3, hotter for a "
            f"smaller model), then algorithm.lr (now {cfg.algorithm.lr:g}; 1e-4 rose "
            "steadily where 3e-4 fell on a small model)")


def flat_signal(h: RunHistory, t: Thresholds) -> bool:
    """Most groups' rewards all agree over the window (samples/zero_std_group_frac), or,
    for a run that does not log it, the reward barely varies (reward/std)."""
    flat = h.last(M.SAMPLES_ZERO_STD_GROUP_FRAC, t.stuck_window)
    if flat:
        return statistics.fmean(v for _, v in flat) >= t.stuck_zero_std_frac
    stds = h.last(M.REWARD_STD, t.stuck_window) or [(0, 0.0)]
    return statistics.fmean(v for _, v in stds) < t.stuck_std


@reads(metrics=(M.REWARD_MEAN, M.LOGPROB_GAP_MEAN, M.LOGPROB_GAP_UNTEMPERED_MEAN),
       events=("weight_sync.report",), facts=("temperature",))
def temperature_logprobs(h: RunHistory, f: RunFacts, t: Thresholds,
                         now: float) -> list[Finding]:
    if f.temperature in (None, 0.0, 1.0) or not h.steps:
        return []
    step = h.steps[-1]
    gap = h.metrics.get(M.LOGPROB_GAP_MEAN, {}).get(step)
    raw = h.metrics.get(M.LOGPROB_GAP_UNTEMPERED_MEAN, {}).get(step)
    stale = h.metrics.get(M.STALENESS_MAX, {}).get(step, 0.0)
    # The sync this step's rollout followed: the one that ended the previous step.
    synced = [s for s in h.syncs if s.step == step - 1] or h.syncs[:1]
    if gap is None or raw is None or stale != 0 or not synced or not synced[-1].matched:
        return []                  # only right after a sync that applied, on fresh samples
    if gap < t.temperature_gap or raw > gap / 4:
        return []
    return [Finding(
        kind="TemperatureLogprobs", key="TemperatureLogprobs", step=step,
        cause=(f"Behaviour logprobs are not temperature-scaled: right after a sync they differ "
               f"from the learner's T={f.temperature:g} recompute by {gap:.3f} nats/token but "
               f"match the untempered distribution to {raw:.3f}."),
        runbook=("Check the rollout backend's logprob mode: vLLM must return processed "
                 'logprobs (rollout.logprobs_mode = "processed_logprobs"); keep '
                 'rollout.preflight = "error" so a run with raw logprobs refuses to start.'),
        evidence={"values": {M.LOGPROB_GAP_MEAN: gap, M.LOGPROB_GAP_UNTEMPERED_MEAN: raw,
                             "temperature": f.temperature},
                  "series": chart(h, M.LOGPROB_GAP_MEAN)})]


@reads(metrics=(M.LOGPROB_GAP_MEAN,))
def logprob_gap_high(h: RunHistory, f: RunFacts, t: Thresholds, now: float) -> list[Finding]:
    pts = h.last(M.LOGPROB_GAP_MEAN, 1)
    if not pts or pts[0][1] <= t.gap_high or temperature_logprobs(h, f, t, now):
        return []                  # the temperature rule names the more specific cause
    step, gap = pts[0]
    if f.is_external:
        runbook = ("Check staleness (how far generation runs ahead of training), that each "
                   "weight update reached the inference engine, and its numerics (dtype, "
                   "logprobs before or after temperature scaling); "
                   + lever(f.framework, "is_cap", "truncated importance sampling")
                   + " bounds the damage meanwhile.")
    else:
        runbook = (f"Check staleness/max (the {f.async_policy} policy's bound is "
                   f"{f.staleness_bound}), weight_sync/matched (did the sync apply?), and "
                   f"engine numerics (model.dtype = {f.config.model.dtype!r}, rollout.type = "
                   f"{f.config.rollout.type!r}); algorithm.tis_cap (now "
                   f"{f.config.algorithm.tis_cap:g}) bounds the damage meanwhile.")
    return [Finding(
        kind="LogprobGapHigh", key="LogprobGapHigh", step=step,
        cause=(f"The behaviour policy differs from the learner: logprob gap {gap:.3f} "
               f"nats/token at step {step} (threshold {t.gap_high:g})."),
        runbook=runbook,
        evidence={"values": {M.LOGPROB_GAP_MEAN: gap,
                             M.STALENESS_MAX: h.metrics.get(M.STALENESS_MAX, {}).get(step)},
                  "series": chart(h, M.LOGPROB_GAP_MEAN)})]


@reads(metrics=(M.LOGPROB_GAP_MEAN,), events=("weight_sync.report",))
def logprob_gap_drift(h: RunHistory, f: RunFacts, t: Thresholds, now: float) -> list[Finding]:
    pts = h.last(M.LOGPROB_GAP_MEAN, t.drift_window)
    if len(pts) < t.drift_window:
        return []
    values = [v for _, v in pts]
    rising = all(b > a for a, b in zip(values, values[1:], strict=False))
    prints = {s.fingerprint_learner for s in h.syncs if s.step >= pts[0][0]}
    if not rising or values[-1] - values[0] < t.drift_min or len(prints) != 1:
        return []
    return [Finding(
        kind="LogprobGapDrift", key="LogprobGapDrift", step=pts[-1][0],
        cause=(f"The logprob gap rose for {len(pts)} steps ({values[0]:.4f} -> "
               f"{values[-1]:.4f}) while the learner's weights did not change."),
        runbook=("With unchanged weights the gap must be flat: check engine state that "
                 "persists across steps (prefix cache not reset after a sync, KV cache "
                 "dtype, batch-dependent kernels); try rollout.enable_prefix_caching = false."),
        evidence={"values": {"first": values[0], "last": values[-1]},
                  "series": chart(h, M.LOGPROB_GAP_MEAN)})]


@reads(metrics=(M.STALENESS_MAX,), facts=("staleness_bound",))
def staleness_over_bound(h: RunHistory, f: RunFacts, t: Thresholds,
                         now: float) -> list[Finding]:
    pts = h.last(M.STALENESS_MAX, 1)
    if not pts or pts[0][1] <= f.staleness_bound:
        return []
    step, stale = pts[0]
    if f.is_external:
        bound = f"the run's staleness bound is {f.staleness_bound}"
        runbook = ("Check where the framework drops samples older than its bound after a "
                   "resume or restart (are weight versions restored?); lower "
                   + lever(f.framework, "staleness", "how far generation may run ahead")
                   + " so producers do not run ahead.")
    else:
        bound = f"the {f.async_policy} policy's bound is {f.staleness_bound}"
        runbook = ("Check the buffer's staleness filter after a resume or restart "
                   "(versions restored?), and buffer/dropped_stale; "
                   + (f"lower async_policy.max_staleness (now {f.staleness_bound}) or "
                      if f.async_policy in ("partial_rollout", "fully_async") else "")
                   + "lower rollout.prompts_per_step (now "
                   f"{f.config.rollout.prompts_per_step}) so producers do not run ahead.")
    return [Finding(
        kind="StalenessOverBound", key="StalenessOverBound", step=step,
        cause=f"Samples {stale:g} versions old were trained on at step {step}; {bound}.",
        runbook=runbook,
        evidence={"values": {M.STALENESS_MAX: stale, "bound": f.staleness_bound},
                  "series": chart(h, M.STALENESS_MAX)})]


@reads(any_of=(M.WEIGHT_SYNC_VERSION_LEARNER, M.STALENESS_MEAN))
def version_regression(h: RunHistory, f: RunFacts, t: Thresholds, now: float) -> list[Finding]:
    versions = h.last(M.WEIGHT_SYNC_VERSION_LEARNER, 2)
    stale = h.last(M.STALENESS_MEAN, 1)
    if len(versions) == 2 and versions[1][1] < versions[0][1]:
        step = versions[1][0]
        cause = (f"The weight version went backwards at step {step}: "
                 f"{versions[0][1]:g} -> {versions[1][1]:g}.")
    elif stale and stale[0][1] < 0:
        step = stale[0][0]
        cause = f"Staleness is negative ({stale[0][1]:g}) at step {step}: the version went back."
    else:
        return []
    return [Finding(
        kind="VersionRegression", key="VersionRegression", step=step, cause=cause,
        runbook=("Check where the version counter is restored (resume from checkpoint, "
                 "a restarted learner); staleness filters silently stop working while "
                 "versions are negative. Resume from the last good checkpoint."),
        evidence={"values": {"version_learner": versions[-1][1] if versions else None},
                  "series": chart(h, M.WEIGHT_SYNC_VERSION_LEARNER)})]


@reads(metrics=(M.REWARD_MEAN,), events=("span",))
def phase_hang(h: RunHistory, f: RunFacts, t: Thresholds, now: float) -> list[Finding]:
    if f.status != "running" or len(h.steps) < 2 or not h.spans:
        return []
    # Nothing can be stalled for less than hang_min_s: most evaluations (one per event)
    # end here, before the walks over every span below.
    last = h.last_span
    stalled = now - max(h.last_ts, last.end)
    if stalled <= t.hang_min_s:
        return []
    current = h.steps[-1]
    order = [s.phase for s in sorted((s for s in h.spans if s.step == current),
                                     key=lambda s: s.start)]
    order = list(dict.fromkeys(order))
    if last.phase not in order:
        return []
    i = order.index(last.phase)
    phase = order[(i + 1) % len(order)]
    spans = [s for s in h.spans if s.phase == phase]
    median = statistics.median(s.end - s.start for s in spans)
    if stalled <= t.hang_factor * median:
        return []
    latest = max(s.step for s in spans)
    devices = sorted({s.device for s in spans if s.step == latest})
    where = ", ".join(devices)
    return [Finding(
        kind="PhaseHang", key=f"PhaseHang:{phase}", step=last.step,
        cause=(f"Stuck in {phase} on {where}: no progress for {stalled:.0f} s, "
               f"{stalled / max(median, 1e-9):.0f}x the phase's median {median:.2f} s."),
        runbook=(f"Look at the {phase} worker on {where} (py-spy dump, Ray dashboard); a "
                 "weight sync that hangs is usually a collective waiting for a peer. "
                 "Stop the run and resume from its last checkpoint."),
        evidence={"values": {"phase": phase, "device": where, "stalled_s": stalled,
                             "median_s": median, "factor": t.hang_factor},
                  "series": chart(h, M.TIME_STEP_S)})]


REPORT_INTERVALS = 2   # StoppedReporting judges a run's cadence from this many intervals


@reads()
def stopped_reporting(h: RunHistory, f: RunFacts, t: Thresholds,
                      now: float) -> list[Finding]:
    """An external run's process went quiet: no event for hang_factor x its usual time
    between reported steps (and at least hang_min_s). Such a run may have no Ray job for
    sync_runs to follow and no spans for PhaseHang to name a phase by, and a framework run
    that hangs (a stuck collective, a wedged generation server) reports no error either."""
    if f.status != "running" or not f.is_external or h.spans:
        return []       # rlplane's engine reports spans: PhaseHang names the phase there
    arrivals = sorted(h.step_ts.items())
    if len(arrivals) <= REPORT_INTERVALS:
        return []
    intervals = [max(b[1] - a[1], 0.0) for a, b in zip(arrivals, arrivals[1:], strict=False)]
    median = statistics.median(intervals)
    silent = now - h.last_ts
    if silent <= max(t.hang_factor * median, t.hang_min_s):
        return []
    step = arrivals[-1][0]
    return [Finding(
        kind="StoppedReporting", key="StoppedReporting", step=step,
        cause=(f"The {FRAMEWORK_LABELS.get(f.framework, f.framework)} process stopped "
               f"reporting: nothing for {silent:.0f} s since step {step}, "
               f"{silent / max(median, 1e-9):.0f}x its usual "
               f"{median:.1f} s between reported steps. The run still counts as running."),
        runbook=("Look at the training process: if it is alive it hangs (take a stack dump "
                 "with py-spy dump --pid <pid>; a collective waiting for a peer, a stuck "
                 "generation server or dataloader are the usual places); if it is gone, its "
                 "own log says why, and it never sent a final status. Stop the run here "
                 "once you know, and resume from its last checkpoint."),
        evidence={"values": {"silent_s": silent, "median_interval_s": median,
                             "last_step": step, "factor": t.hang_factor},
                  "series": chart(h, M.REWARD_MEAN)})]


@reads()
def run_lost(h: RunHistory, f: RunFacts, t: Thresholds, now: float) -> list[Finding]:
    if f.status != "lost":
        return []
    what = f"{f.framework} command" if f.is_external else "driver"
    return [Finding(
        kind="RunLost", key="RunLost", step=h.steps[-1] if h.steps else None,
        cause=(f"The run's {what} is gone: the cluster no longer knows its Ray job, or the "
               f"{what} was killed before it could report (the run's status says which)."),
        runbook=("Check the Ray cluster (restarted head, deleted job, node lost, the OOM "
                 "killer in the node's kernel log); "
                 + ("resume the training from its last checkpoint with the framework's own "
                    "resume option, as a new run." if f.is_external else
                    "fork the run from its last checkpoint to continue.")),
        evidence={"values": {"last_step": h.steps[-1] if h.steps else None},
                  "series": chart(h, M.REWARD_MEAN)})]



@reads()
def driver_restarted(h: RunHistory, f: RunFacts, t: Thresholds,
                     now: float) -> list[Finding]:
    """The restart's own notice: open from the restart until the resumed driver trains
    past the step its predecessor reached (then it clears)."""
    if not f.restarts:
        return []
    n, last = len(f.restarts), f.restarts[-1]
    reached = last.get("step")
    if h.steps and h.steps[-1] > (-1 if reached is None else reached):
        return []
    after = "before its first step" if reached is None else f"after step {reached}"
    return [Finding(
        kind="DriverRestarted", key=f"DriverRestarted-{n}", step=reached,
        cause=(f"The run's driver ended {after} ({last.get('cause', '')}) and was submitted "
               f"again, restart {n} of {f.max_restarts} (max_restarts): it resumes from its "
               "latest checkpoint and trains the steps after it again."),
        runbook=("Nothing to do once this clears (the resumed driver trained past the step "
                 "its predecessor reached). If drivers keep dying, read the ended Ray job's "
                 f"log ({last.get('job', '')}, on the cluster page) and the node's kernel "
                 "log (the OOM killer); checkpoint.every_steps bounds the steps a restart "
                 "trains again, max_restarts how many restarts come before the run is "
                 "marked lost."),
        evidence={"values": {"restart": n, "max_restarts": f.max_restarts,
                             "last_step": reached},
                  "series": chart(h, M.REWARD_MEAN)})]


# Each alert kind and the rule whose findings carry it, in evaluation order.
RULES: dict[str, Rule] = {
    "WeightSyncDesync": weight_sync_desync,
    "StuckReward": stuck_reward,
    "TemperatureLogprobs": temperature_logprobs,
    "LogprobGapHigh": logprob_gap_high,
    "LogprobGapDrift": logprob_gap_drift,
    "StalenessOverBound": staleness_over_bound,
    "VersionRegression": version_regression,
    "PhaseHang": phase_hang,
    "StoppedReporting": stopped_reporting,
    "BubbleHigh": bubble_high,
    "ResyncSlow": resync_slow,
    "RunLost": run_lost,
    "DriverRestarted": driver_restarted,
    "RewardErrors": reward_errors,
    "RewardOverOptimization": reward_over_optimization,
    "ImportanceWeightCollapse": importance_weight_collapse,
    "EntropyCollapse": entropy_collapse,
    "LengthBlowup": length_blowup,
    "NonTermination": non_termination,
    "ThroughputRegression": throughput_regression,
    "DataIntegrity": data_integrity,
    "EnvErrors": env_errors,
    "EnvHang": env_hang,
}
KINDS = list(RULES)


def evaluate(h: RunHistory, f: RunFacts, t: Thresholds, now: float) -> list[Finding]:
    """Every rule's findings; on an external run only the rules whose inputs it has."""
    return [finding for rule in RULES.values()
            if not f.is_external or not missing(rule.needs, h, f)
            for finding in rule(h, f, t, now)]
