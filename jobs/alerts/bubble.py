"""The rules about where a step's time goes: BubbleHigh (devices idle, generation or the
reward stage taking the step, stragglers holding every batch) and ResyncSlow (a weight
sync that took far longer than the run's usual one, and whether it waited for in-flight
generation or moved slowly). Registered in jobs/alerts/rules.py's RULES."""

from __future__ import annotations

import statistics

from engine.api import metrics as M
from engine.config import FRAMEWORK_LABELS
from jobs.alerts import levers
from jobs.alerts.evidence import chart
from jobs.alerts.history import Finding, RunFacts, RunHistory, Thresholds
from jobs.alerts.inputs import reads
from jobs.alerts.knobs import lever
from jobs.alerts.whatif import planner_advice


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
              sum(h.spans_of_step.get(step, 0) for step in timed))
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
