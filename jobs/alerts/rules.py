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
jobs/alerts/rewards.py.

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
from jobs.alerts import levers
from jobs.alerts.data import data_integrity
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
from jobs.alerts.whatif import planner_advice

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
                  "that differ"))
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


def straggler_steps(h: RunHistory, steps: list[int], t: Thresholds) -> list[float] | None:
    """The p99 generation time of each step whose samples' p99 is over straggler_p99_p50 x
    their p50 and over straggler_min_s (per-sample times, so any async policy), else
    None; runs without per-sample times fall back to the step's generation time against
    the run's own median before the window."""
    p50, p99 = h.metrics.get(M.ROLLOUT_GEN_S_P50, {}), h.metrics.get(M.ROLLOUT_GEN_S_P99, {})
    if all(s in p99 and s in p50 for s in steps):
        values = [p99[s] for s in steps]
        slow = all(p99[s] > max(t.straggler_p99_p50 * p50[s], t.straggler_min_s)
                   for s in steps)
        return values if slow else None
    rollout = h.metrics.get(M.TIME_ROLLOUT_S, {})
    before = [v for s, v in h.series(M.TIME_ROLLOUT_S) if s < steps[0]]
    if len(before) < 2:
        return None
    limit = max(t.straggler_factor * statistics.median(before), t.straggler_min_s)
    values = [rollout.get(s, 0.0) for s in steps]
    return values if min(values) > limit else None


LEARNER_BOUND_GAP = 0.15   # learner side this much busier than the rollout side


def side_utilization(h: RunHistory, steps: list[int]) -> tuple[float, float] | None:
    """Mean busy share of the rollout side's devices and of the learner side's over
    ``steps`` (a device is on the side whose phase it ran), or None without both."""
    sides: dict[str, list[float]] = {"rollout": [], "learner": []}
    for name, series in h.metrics.items():
        member = M.DEVICE_PHASE_UTILIZATION.match(name)
        if member is None or member["phase"] not in sides:
            continue
        if any(series.get(s, 0.0) > 0 for s in steps):
            total = h.metrics.get(M.DEVICE_UTILIZATION.of(device=member["device"]), {})
            sides[member["phase"]] += [total.get(s, 0.0) for s in steps]
    if not sides["rollout"] or not sides["learner"]:
        return None
    return (statistics.fmean(sides["rollout"]), statistics.fmean(sides["learner"]))


@reads(metrics=(M.REWARD_MEAN, M.TIME_STEP_S),
       any_of=(M.TIME_ROLLOUT_S, M.TIME_REWARD_S, M.ROLLOUT_SHARE, M.BUBBLE,
               M.ROLLOUT_GEN_S_P99))
def bubble_high(h: RunHistory, f: RunFacts, t: Thresholds, now: float) -> list[Finding]:
    # The run's first step is left out, as the planner and the benches do: an async
    # policy's pipeline fills there (nothing to train before the first batch exists).
    steps = h.steps[1:][-t.bubble_window:]
    if len(steps) < t.bubble_window:
        return []

    def share(name: str, step: int) -> float:
        if name == "reward_share":
            reward = h.metrics.get(M.TIME_REWARD_S, {}).get(step, 0.0)
            return reward / max(h.metrics.get(M.TIME_STEP_S, {}).get(step, 1.0), 1e-9)
        if name == M.ROLLOUT_SHARE and step not in h.metrics.get(name, {}):
            # a framework logs its phase times, not the share: derive it as the engine does
            rollout = h.metrics.get(M.TIME_ROLLOUT_S, {}).get(step, 0.0)
            return rollout / max(h.metrics.get(M.TIME_STEP_S, {}).get(step, 1.0), 1e-9)
        return h.metrics.get(name, {}).get(step, 0.0)

    # The most specific cause first: a straggler also makes generation the whole step.
    stragglers = straggler_steps(h, steps, t)
    if stragglers is not None:
        p50 = h.metrics.get(M.ROLLOUT_GEN_S_P50, {}).get(steps[-1])
        what = (f"the slowest generations take {min(stragglers):.1f}+ s"
                + (f" where the median sample takes {p50:.2f} s" if p50 is not None
                   else f", over {t.straggler_factor:g}x the run's median")
                + ": stragglers hold every batch")
        name, limit, values, problem = "straggler", t.straggler_min_s, stragglers, "straggler"
    else:
        checks = [("reward_share", t.reward_share_max,
                   "the reward stage takes {:.0%}+ of each step", "reward"),
                  (M.ROLLOUT_SHARE, t.rollout_share_max,
                   "generation takes {:.0%}+ of each step", "generation"),
                  (M.BUBBLE, t.bubble_max,
                   "devices sit idle for {:.0%}+ of each step", M.BUBBLE)]
        if (not f.is_external and f.config.placement.type == "disaggregated"
                and f.config.async_policy.type != "sync"):
            # Generation on its own devices, overlapping learning, taking the whole step is
            # what they are for: a learner left waiting for it shows as the bubble.
            checks = [c for c in checks if c[0] != M.ROLLOUT_SHARE]
        hit = next(((name, limit, what, [share(name, s) for s in steps], problem)
                    for name, limit, what, problem in checks
                    if min(share(name, s) for s in steps) > limit), None)
        if hit is None:
            return []
        name, limit, what, values, problem = hit
        what = what.format(min(values))
    lead = {"straggler": "A few generations finish far behind the rest.",
            "reward": "Scoring blocks the generator and the learner.",
            "generation": "Long-tail generations hold every step.",
            M.BUBBLE: "Devices wait for each other."}[problem]
    if problem == M.BUBBLE and not f.is_external and \
            f.config.placement.type == "disaggregated":
        sides = side_utilization(h, steps)
        if sides is not None and sides[1] - sides[0] > LEARNER_BOUND_GAP:
            problem = "learner"
            lead = (f"The generator waits for the learner: rollout devices busy "
                    f"{sides[0]:.0%} of each step, learner devices {sides[1]:.0%}.")
    series = {"reward_share": M.TIME_REWARD_S,
              "straggler": (M.ROLLOUT_GEN_S_P99 if M.ROLLOUT_GEN_S_P99 in h.metrics
                            else M.TIME_ROLLOUT_S)}.get(name, name)
    if f.is_external:
        where, runbook = "", f"{lead} {external_levers(f.framework, problem)}"
    else:
        where = (f" (placement {f.config.placement.type}, {f.config.async_policy.type} "
                 "policy)")
        runbook = levers.runbook(f.config, problem, lead) + _what_if(h, f)
    return [Finding(
        kind="BubbleHigh", key=f"BubbleHigh:{name}", step=steps[-1],
        cause=f"For {len(steps)} steps, {what}{where}.",
        runbook=runbook,
        evidence={"values": {name: values[-1], "threshold": limit},
                  "series": chart(h, series)})]


def external_levers(framework: str, problem: str) -> str:
    """BubbleHigh's levers for a run another framework trains: what to change, in its own
    knob names where we know them (the planner's what-if needs a RunConfig)."""
    tail = "cap the long tail: " + lever(framework, "max_new_tokens", "a shorter completion limit")
    overlap = ("overlap generation with training (a one-step-off or fully async mode), if "
               f"{FRAMEWORK_LABELS.get(framework, framework)} offers one")
    levers_of = {
        "straggler": [tail, "let a step end once most of its groups are complete (partial "
                      "rollouts) or " + overlap, "check the inference workers for a slow one"],
        "generation": [overlap, tail, "give generation more inference devices"],
        "reward": ["score completions as they finish (a pool of reward workers, async "
                   "reward) instead of after the whole batch", "speed up the verifier itself"],
        M.BUBBLE: [overlap, "rebalance devices between generation and training"],
    }
    listed = "; ".join(f"({i}) {x}" for i, x in enumerate(levers_of[problem], start=1))
    return f"Next levers: {listed}."


def _what_if(h: RunHistory, f: RunFacts) -> str:
    """The planner's best alternative and its predicted gain, where it can fit the run."""
    # The planner reads the timed steps' metrics and those steps' spans: the same advice
    # until a metric value or a span of a timed step arrives.
    timed = h.metrics.get(M.TIME_STEP_S, {})
    inputs = (f.config, sum(map(len, h.metrics.values())),
              sum(s.step in timed for s in h.spans))
    advice = h.derived("what_if", inputs,
                       lambda: planner_advice(f.config, h.metrics, h.spans))
    return f" {advice}" if advice else ""


def generation_wait(h: RunHistory, step: int) -> tuple[float, list[str], bool]:
    """How long the sync of ``step`` waited for in-flight generation, from the workers'
    spans: a worker takes new weights between calls, so its receive (its last weight_sync
    span of the sync) starts only when its rollout and reward spans end. Returns the
    longest such wait (s), the devices that waited it, and whether every rollout device's
    receive span has arrived (spans come in batches, after the sync's report)."""
    sync = [s for s in h.spans if s.phase == "weight_sync" and s.step == step]
    rollout_devices = {s.device for s in h.spans if s.phase == "rollout"}
    if not sync:
        return 0.0, [], not rollout_devices
    begun = min(s.start for s in sync)               # the learner's prepare: right after send
    waits: dict[str, float] = {}
    for device in rollout_devices:
        mine = [s for s in sync if s.device == device]
        if not mine:
            continue
        received = max(s.start for s in mine)
        waits[device] = sum(max(0.0, min(s.end, received) - max(s.start, begun))
                            for s in h.spans if s.device == device
                            and s.phase in ("rollout", "reward"))
    complete = set(waits) == rollout_devices
    if not waits:
        return 0.0, [], complete
    longest = max(waits.values())
    return longest, sorted(d for d, w in waits.items() if w >= 0.9 * longest), complete


@reads(metrics=(M.WEIGHT_SYNC_LATENCY_S,))
def resync_slow(h: RunHistory, f: RunFacts, t: Thresholds, now: float) -> list[Finding]:
    pts = h.series(M.WEIGHT_SYNC_LATENCY_S)
    if len(pts) < 3:
        return []
    step, latency = pts[-1]
    median = statistics.median(v for _, v in pts[:-1])
    if latency <= max(t.resync_factor * median, t.resync_min_s):
        return []
    sync = next((s for s in reversed(h.syncs) if s.latency_s == latency),
                h.syncs[-1] if h.syncs else None)
    waited, devices, complete = generation_wait(h, sync.step) if sync else (0.0, [], True)
    if not complete and h.steps and h.steps[-1] <= sync.step + 1:
        return []          # the receivers' spans are on their way: judge on the next batch
    moved = max(latency - waited, 1e-9)               # the transport's own share
    size = f"{sync.bytes / 1e9:.3g} GB" if sync else "the weights"
    rate = f"{sync.bytes / 1e9 / moved:.3g} GB/s" if sync else "?"
    slow = (f"Weight resync took {latency:.1f} s at step {step}, "
            f"{latency / max(median, 1e-9):.0f}x the run's median {median:.2f} s")
    if waited >= t.resync_wait_share * latency:
        key = "ResyncSlow:generation"
        cause = (f"{slow}: the new weights waited for in-flight generation: "
                 f"{', '.join(devices)} finished a generation call for {waited:.1f} s "
                 f"before taking them; the transport itself moved {size} in "
                 f"{latency - waited:.2f} s ({rate}).")
        runbook = levers.runbook(
            f.config, "resync_wait",
            "The transport is not the cause: a rollout worker takes new weights only "
            "between generate calls, so a long call (a straggler, long generations) "
            "delays the resync. See BubbleHigh for stragglers.")
    else:
        key = "ResyncSlow:transport"
        cause = (f"{slow}: the transport was slow: {size} in {moved:.1f} s ({rate})"
                 + (f"; waiting for generation took only {waited:.1f} s" if waited else "")
                 + ".")
        runbook = (f"Check the transport (weight_sync.type = {f.config.weight_sync.type!r}) "
                   "and the rollout workers it waits for: a slow or stuck receiver, a "
                   "network or object-store stall; weight_sync/gb_per_s (GB/s) shows "
                   "whether bandwidth dropped; try another weight_sync.type to isolate it.")
    if f.is_external and key == "ResyncSlow:generation":
        runbook = ("The transport is not the cause: an inference worker takes new weights "
                   "only between generate calls, so a long call delays the resync; cap the "
                   "long tail (" + lever(f.framework, "max_new_tokens", "shorter completions")
                   + ") or let generation continue across the update if the framework can.")
    elif f.is_external:
        runbook = ("Check the weight transport and the inference workers it waits for: a "
                   "slow or stuck receiver, a network or storage stall.")
    return [Finding(
        kind="ResyncSlow", key=key, step=step, cause=cause, runbook=runbook,
        evidence={"values": {"latency_s": latency, "median_s": median,
                             "generation_wait_s": waited, "transport_s": moved,
                             "bytes": sync.bytes if sync else None},
                  "series": chart(h, M.WEIGHT_SYNC_LATENCY_S)})]


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
    "RewardErrors": reward_errors,
    "RewardOverOptimization": reward_over_optimization,
    "ImportanceWeightCollapse": importance_weight_collapse,
    "EntropyCollapse": entropy_collapse,
    "LengthBlowup": length_blowup,
    "NonTermination": non_termination,
    "ThroughputRegression": throughput_regression,
    "DataIntegrity": data_integrity,
}
KINDS = list(RULES)


def evaluate(h: RunHistory, f: RunFacts, t: Thresholds, now: float) -> list[Finding]:
    """Every rule's findings; on an external run only the rules whose inputs it has."""
    return [finding for rule in RULES.values()
            if not f.is_external or not missing(rule.needs, h, f)
            for finding in rule(h, f, t, now)]
