"""The alert rules: pure functions over a run's history, one per failure mode.

    findings = evaluate(history, facts, thresholds, now)      # every rule, in RULES order

A rule returns the findings that hold now (usually zero or one); a condition that no
longer holds simply is not returned, and the lifecycle resolves its alert. Rules that
depend on time passing (PhaseHang) read ``now``; the periodic task evaluates them even
when no event arrives. Every finding carries its evidence: the values and the series
that triggered it, small enough for a chart.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from jobs.alerts.history import Finding, RunFacts, RunHistory, Thresholds

Rule = Callable[[RunHistory, RunFacts, Thresholds, float], list[Finding]]
CHART_POINTS = 30  # points of a series kept as evidence


def chart(h: RunHistory, name: str) -> dict:
    pts = h.last(name, CHART_POINTS)
    return {"name": name, "steps": [s for s, _ in pts], "values": [v for _, v in pts]}


def slope(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of value over step."""
    xs, ys = [s for s, _ in points], [v for _, v in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


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
                 "receiver); compare weight_sync.report fingerprints per worker. Change "
                 "weight_sync.type to another transport to isolate it."),
        evidence={"values": {k: getattr(s, k) for k in (
                      "version_learner", "version_rollout", "fingerprint_learner",
                      "fingerprint_rollout")},
                  "series": chart(h, "weight_sync/matched")})]


def stuck_reward(h: RunHistory, f: RunFacts, t: Thresholds, now: float) -> list[Finding]:
    pts = h.last("reward/mean", t.stuck_window)
    if len(pts) < t.stuck_window or abs(slope(pts)) >= t.stuck_slope:
        return []
    first = pts[0][0]
    window = [s for s in h.syncs if s.step >= first]
    versions = [s.version_rollout for s in window]
    gaps = [v for s, v in h.series("logprob_gap/mean") if s >= first]
    if any(s.verified and s.fingerprint_learner != s.fingerprint_rollout for s in window) or \
            (len(versions) > 1 and max(versions) == min(versions)):
        key, why = "weights", "the generator is not receiving new weights"
        fix = "see WeightSyncDesync: check the weight sync and the fingerprints per worker"
    elif gaps and statistics.fmean(gaps) > t.gap_high:
        key, why = "behaviour", "the behaviour policy differs from the learner"
        fix = ("check logprob_gap and tis/clip_frac: temperature scaling of the engine's "
               "logprobs, staleness (async_policy), engine numerics (model.dtype)")
    elif flat_signal(h, t):
        key, why = "signal", "learning signal is flat (check reward variance / advantages)"
        fix = ("check samples/zero_std_group_frac, reward/std and reward/accuracy: a group "
               "whose rewards all agree has zero advantages; raise algorithm.group_size, "
               "rollout.temperature or task difficulty, or set algorithm.dynamic_sampling "
               "= true to train only on groups that differ")
    else:
        return []   # rewards still vary: slow learning, not a stuck run
    values = {"slope": slope(pts), "window": len(pts)}
    if flat := h.last("samples/zero_std_group_frac", t.stuck_window):
        values["zero_std_group_frac"] = statistics.fmean(v for _, v in flat)
    return [Finding(
        kind="StuckReward", key=f"StuckReward:{key}", step=pts[-1][0],
        cause=f"Reward has been flat for {len(pts)} steps (slope {slope(pts):+.4f}/step): {why}.",
        runbook=fix[0].upper() + fix[1:] + ".",
        evidence={"values": values, "series": chart(h, "reward/mean")})]


def flat_signal(h: RunHistory, t: Thresholds) -> bool:
    """Most groups' rewards all agree over the window (samples/zero_std_group_frac), or,
    for a run that does not log it, the reward barely varies (reward/std)."""
    flat = h.last("samples/zero_std_group_frac", t.stuck_window)
    if flat:
        return statistics.fmean(v for _, v in flat) >= t.stuck_zero_std_frac
    stds = h.last("reward/std", t.stuck_window) or [(0, 0.0)]
    return statistics.fmean(v for _, v in stds) < t.stuck_std


def temperature_logprobs(h: RunHistory, f: RunFacts, t: Thresholds,
                         now: float) -> list[Finding]:
    if f.temperature in (0.0, 1.0) or not h.steps:
        return []
    step = h.steps[-1]
    gap = h.metrics.get("logprob_gap/mean", {}).get(step)
    raw = h.metrics.get("logprob_gap/untempered_mean", {}).get(step)
    stale = h.metrics.get("staleness/max", {}).get(step, 0.0)
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
        evidence={"values": {"logprob_gap/mean": gap, "logprob_gap/untempered_mean": raw,
                             "temperature": f.temperature},
                  "series": chart(h, "logprob_gap/mean")})]


def logprob_gap_high(h: RunHistory, f: RunFacts, t: Thresholds, now: float) -> list[Finding]:
    pts = h.last("logprob_gap/mean", 1)
    if not pts or pts[0][1] <= t.gap_high or temperature_logprobs(h, f, t, now):
        return []                  # the temperature rule names the more specific cause
    step, gap = pts[0]
    return [Finding(
        kind="LogprobGapHigh", key="LogprobGapHigh", step=step,
        cause=(f"The behaviour policy differs from the learner: logprob gap {gap:.3f} "
               f"nats/token at step {step} (threshold {t.gap_high:g})."),
        runbook=("Check staleness/max (async_policy bound), weight_sync/matched (did the "
                 "sync apply?), and engine numerics (model.dtype, rollout.type); "
                 "algorithm.tis_cap bounds the damage meanwhile."),
        evidence={"values": {"logprob_gap/mean": gap,
                             "staleness/max": h.metrics.get("staleness/max", {}).get(step)},
                  "series": chart(h, "logprob_gap/mean")})]


def logprob_gap_drift(h: RunHistory, f: RunFacts, t: Thresholds, now: float) -> list[Finding]:
    pts = h.last("logprob_gap/mean", t.drift_window)
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
                  "series": chart(h, "logprob_gap/mean")})]


def staleness_over_bound(h: RunHistory, f: RunFacts, t: Thresholds,
                         now: float) -> list[Finding]:
    pts = h.last("staleness/max", 1)
    if not pts or pts[0][1] <= f.staleness_bound:
        return []
    step, stale = pts[0]
    return [Finding(
        kind="StalenessOverBound", key="StalenessOverBound", step=step,
        cause=(f"Samples {stale:g} versions old were trained on at step {step}; the "
               f"{f.async_policy} policy's bound is {f.staleness_bound}."),
        runbook=("Check the buffer's staleness filter after a resume or restart (versions "
                 "restored?), and buffer/dropped_stale; lower async_policy's staleness bound "
                 "or rollout.prompts_per_step so producers do not run ahead."),
        evidence={"values": {"staleness/max": stale, "bound": f.staleness_bound},
                  "series": chart(h, "staleness/max")})]


def version_regression(h: RunHistory, f: RunFacts, t: Thresholds, now: float) -> list[Finding]:
    versions = h.last("weight_sync/version_learner", 2)
    stale = h.last("staleness/mean", 1)
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
                  "series": chart(h, "weight_sync/version_learner")})]


def phase_hang(h: RunHistory, f: RunFacts, t: Thresholds, now: float) -> list[Finding]:
    if f.status != "running" or len(h.steps) < 2 or not h.spans:
        return []
    last = max(h.spans, key=lambda s: s.end)
    order = [s.phase for s in sorted((s for s in h.spans if s.step == h.steps[-1]),
                                     key=lambda s: s.start)]
    order = list(dict.fromkeys(order))
    if last.phase not in order:
        return []
    i = order.index(last.phase)
    phase = order[(i + 1) % len(order)]
    durations = [s.end - s.start for s in h.spans if s.phase == phase]
    median = statistics.median(durations)
    stalled = now - max(h.last_ts, last.end)
    if stalled <= max(t.hang_factor * median, t.hang_min_s):
        return []
    devices = sorted({s.device for s in h.spans if s.phase == phase
                      and s.step == max(x.step for x in h.spans if x.phase == phase)})
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
                  "series": chart(h, "time/step_s")})]


def bubble_high(h: RunHistory, f: RunFacts, t: Thresholds, now: float) -> list[Finding]:
    steps = h.steps[-t.bubble_window:]
    if len(steps) < t.bubble_window:
        return []

    def share(name: str, step: int) -> float:
        if name == "straggler":         # generation time against the run's own median
            return h.metrics.get("time/rollout_s", {}).get(step, 0.0)
        if name == "reward_share":
            reward = h.metrics.get("time/reward_s", {}).get(step, 0.0)
            return reward / max(h.metrics.get("time/step_s", {}).get(step, 1.0), 1e-9)
        return h.metrics.get(name, {}).get(step, 0.0)

    before = [v for s, v in h.series("time/rollout_s") if s < steps[0]]
    straggler_limit = (max(t.straggler_factor * statistics.median(before), t.straggler_min_s)
                       if len(before) >= 2 else float("inf"))
    # The most specific cause first: a straggler also makes generation the whole step.
    checks = [("straggler", straggler_limit,
               "generation takes {:.1f}+ s a step, over " f"{t.straggler_factor:g}x the "
               "run's median: stragglers hold every batch"),
              ("reward_share", t.reward_share_max, "the reward stage takes {:.0%}+ of each step"),
              ("rollout_share", t.rollout_share_max, "generation takes {:.0%}+ of each step"),
              ("bubble", t.bubble_max, "devices sit idle for {:.0%}+ of each step")]
    hit = next(((name, limit, what, [share(name, s) for s in steps])
                for name, limit, what in checks
                if min(share(name, s) for s in steps) > limit), None)
    if hit is None:
        return []
    name, limit, what, values = hit
    advice = {
        "bubble": "overlap rollout with learning: async_policy one-step-off or fully async",
        "rollout_share": ("long-tail generations hold every step: use an async policy "
                          "(async_policy one-step-off / fully async) or partial rollout, "
                          "or cap rollout.max_new_tokens"),
        "straggler": ("a few generations finish far behind the rest: use partial rollout "
                      "or an async policy (async_policy one-step-off / fully async) so the "
                      "learner does not wait; check the rollout workers for a slow one"),
        "reward_share": ("scoring blocks the generator and the learner: overlap reward with "
                         "generation (async_policy one-step-off) or speed up the verifier"),
    }[name]
    series = {"reward_share": "time/reward_s", "straggler": "time/rollout_s"}.get(name, name)
    return [Finding(
        kind="BubbleHigh", key=f"BubbleHigh:{name}", step=steps[-1],
        cause=f"For {len(steps)} steps, {what.format(min(values))}.",
        runbook=advice[0].upper() + advice[1:] + ".",
        evidence={"values": {name: values[-1], "threshold": limit},
                  "series": chart(h, series)})]


def resync_slow(h: RunHistory, f: RunFacts, t: Thresholds, now: float) -> list[Finding]:
    pts = h.series("weight_sync/latency_s")
    if len(pts) < 3:
        return []
    step, latency = pts[-1]
    median = statistics.median(v for _, v in pts[:-1])
    if latency <= max(t.resync_factor * median, t.resync_min_s):
        return []
    return [Finding(
        kind="ResyncSlow", key="ResyncSlow", step=step,
        cause=(f"Weight resync took {latency:.1f} s at step {step}, "
               f"{latency / max(median, 1e-9):.0f}x the run's median {median:.2f} s."),
        runbook=("Check the transport (weight_sync.type) and the rollout workers it waits "
                 "for: a slow or stuck receiver, a network or object-store stall; "
                 "weight_sync/gb_per_s (GB/s) shows whether bandwidth dropped."),
        evidence={"values": {"latency_s": latency, "median_s": median},
                  "series": chart(h, "weight_sync/latency_s")})]


def run_lost(h: RunHistory, f: RunFacts, t: Thresholds, now: float) -> list[Finding]:
    if f.status != "lost":
        return []
    return [Finding(
        kind="RunLost", key="RunLost", step=h.steps[-1] if h.steps else None,
        cause="The run's Ray job is gone: the cluster no longer knows it.",
        runbook=("Check the Ray cluster (restarted head, deleted job, node lost); fork the "
                 "run from its last checkpoint to continue."),
        evidence={"values": {"last_step": h.steps[-1] if h.steps else None},
                  "series": chart(h, "reward/mean")})]


def reward_errors(h: RunHistory, f: RunFacts, t: Thresholds, now: float) -> list[Finding]:
    pts = h.last("reward/error_frac", 1)
    if not pts or pts[0][1] <= t.reward_error_frac:
        return []
    step, frac = pts[0]
    return [Finding(
        kind="RewardErrors", key="RewardErrors", step=step,
        cause=(f"The reward function failed on {frac:.0%} of step {step}'s samples (raised "
               f"or returned a non-number; each scored 0 with reason reward_error), over "
               f"the {t.reward_error_frac:.0%} threshold: the policy is learning from "
               f"zeros, not from your reward."),
        runbook=("Read the traceback in the run's log (each distinct error is logged once) "
                 "and fix the function reward.function names: its signature is "
                 "fn(prompt, completion, answer, **row) -> float, and row holds the "
                 "dataset's other columns. reward/python/reward_error counts the failures."),
        evidence={"values": {"reward/error_frac": frac, "threshold": t.reward_error_frac},
                  "series": chart(h, "reward/error_frac")})]


RULES: list[Rule] = [
    weight_sync_desync, stuck_reward, temperature_logprobs, logprob_gap_high,
    logprob_gap_drift, staleness_over_bound, version_regression, phase_hang, bubble_high,
    resync_slow, run_lost, reward_errors,
]
KINDS = ["WeightSyncDesync", "StuckReward", "TemperatureLogprobs", "LogprobGapHigh",
         "LogprobGapDrift", "StalenessOverBound", "VersionRegression", "PhaseHang",
         "BubbleHigh", "ResyncSlow", "RunLost", "RewardErrors"]


def evaluate(h: RunHistory, f: RunFacts, t: Thresholds, now: float) -> list[Finding]:
    return [finding for rule in RULES for finding in rule(h, f, t, now)]
