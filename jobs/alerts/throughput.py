"""ThroughputRegression: samples/s against a baseline, naming the phase that slowed.

    baseline = f.baseline                      the run an operator marked, else a fork's
                                               parent's (lifecycle.baseline_for)
            or baseline_of(h, steps 1..3)      the run's own first healthy steps
    fires when each of the last throughput_window steps generates more than
        throughput_tolerance fewer samples/s than the baseline, and takes
        throughput_min_s longer, and longer responses do not explain it

The run's first step is never part of a baseline: a pipeline fills and kernels compile
there. The phase named is the one whose time (time/<phase>_s) grew most; on a run whose
devices are all CPUs it must also have grown as a share of the step (CPU_SHARE_RISE).
"""

from __future__ import annotations

import statistics

from engine.api import metrics as M
from jobs.alerts import levers
from jobs.alerts.evidence import chart
from jobs.alerts.history import Baseline, Finding, RunFacts, RunHistory, Thresholds
from jobs.alerts.inputs import reads

PHASE_TIMES = {M.PHASE_TIME.of(phase=p): p for p in M.PHASES}
# On CPU devices the host's other processes slow every phase alike (a 2-core CI box: the
# learner's phase 1.9 -> 11-13 s for minutes while a neighbour ran, measured), which
# tells nothing of the run; there a regression must also change the step's make-up: the
# phase that slowed takes this much more of the step than it did.
CPU_SHARE_RISE = 0.25


def median_of(h: RunHistory, name: str, steps: list[int]) -> float | None:
    series = h.metrics.get(name, {})
    values = [series[s] for s in steps if s in series]
    return statistics.median(values) if values else None


def timed_steps(h: RunHistory) -> list[int]:
    sps, step_s = h.metrics.get(M.THROUGHPUT_SAMPLES_PER_S, {}), h.metrics.get(M.TIME_STEP_S, {})
    return [s for s in h.steps if s in sps and s in step_s]


def rate(h: RunHistory, step: int) -> float:
    """Samples generated per second of the step: those trained on and those dynamic
    sampling drew for groups it dropped (a run whose groups flatten resamples more, and
    is busier, not slower)."""
    step_s = h.metrics[M.TIME_STEP_S][step]
    resampled = h.metrics.get(M.SAMPLES_RESAMPLED, {}).get(step, 0.0)
    return h.metrics[M.THROUGHPUT_SAMPLES_PER_S][step] + resampled / max(step_s, 1e-9)


def baseline_of(h: RunHistory, steps: list[int], source: str) -> Baseline:
    return Baseline(samples_per_s=statistics.median(rate(h, s) for s in steps),
                    step_s=median_of(h, M.TIME_STEP_S, steps),
                    phases={name: v for name in PHASE_TIMES
                            if (v := median_of(h, name, steps)) is not None},
                    length=median_of(h, M.RESPONSE_LENGTH_MEAN, steps), source=source)


def first_healthy(h: RunHistory, t: Thresholds, before: int | None = None) -> list[int]:
    """The baseline's steps: up to throughput_baseline_steps after the first, all before
    step ``before``."""
    return [s for s in timed_steps(h)[1:1 + t.throughput_baseline_steps]
            if before is None or s < before]


@reads(metrics=(M.THROUGHPUT_SAMPLES_PER_S, M.TIME_STEP_S))
def throughput_regression(h: RunHistory, f: RunFacts, t: Thresholds,
                          now: float) -> list[Finding]:
    window = timed_steps(h)[1:][-t.throughput_window:]     # the first step: see above
    if len(window) < t.throughput_window:
        return []
    base = f.baseline
    if base is None:
        own = first_healthy(h, t, before=window[0])
        if not own:
            return []
        base = baseline_of(h, own, f"steps {own[0]}-{own[-1]} of this run" if len(own) > 1
                           else f"step {own[0]} of this run")
    step_s = h.metrics[M.TIME_STEP_S]
    if any(rate(h, s) >= base.samples_per_s * (1 - t.throughput_tolerance)
           or step_s[s] - base.step_s <= t.throughput_min_s for s in window):
        return []
    now_sps = statistics.median(rate(h, s) for s in window)
    slower = base.samples_per_s / max(now_sps, 1e-12)
    length = median_of(h, M.RESPONSE_LENGTH_MEAN, window)
    if base.length and length and length / base.length >= slower * (1 - t.throughput_tolerance):
        return []                     # it writes longer, not slower
    grew = {name: (median_of(h, name, window) or 0.0) - base.phases.get(name, 0.0)
            for name in PHASE_TIMES}
    slowest = max(grew, key=grew.get)
    phase = PHASE_TIMES[slowest]
    before, after = base.phases.get(slowest, 0.0), median_of(h, slowest, window) or 0.0
    step_now = statistics.median(step_s[s] for s in window)
    on_cpus = bool(h.spans) and all(x.device.startswith("cpu") for x in h.spans[-50:])
    if on_cpus and after / step_now - before / base.step_s < CPU_SHARE_RISE:
        return []     # every phase slowed alike on CPUs: the host's other processes
    step = window[-1]
    return [Finding(
        kind="ThroughputRegression", key="ThroughputRegression", step=step,
        cause=(f"Throughput fell {1 - now_sps / base.samples_per_s:.0%}: {now_sps:.3g} "
               f"samples/s over the last {len(window)} steps against {base.samples_per_s:.3g} "
               f"in {base.source} (tolerance {t.throughput_tolerance:.0%}); a step takes "
               f"{step_now - base.step_s:+.1f} s, most of it in {phase} ({before:.2f} -> "
               f"{after:.2f} s)."),
        runbook=_runbook(f, phase),
        evidence={"values": {"samples_per_s": now_sps, "baseline_samples_per_s":
                             base.samples_per_s, "step_s": step_now,
                             "baseline_step_s": base.step_s, "phase": phase,
                             "phase_s": after, "baseline_phase_s": before,
                             "baseline": base.source},
                  "series": chart(h, M.THROUGHPUT_SAMPLES_PER_S),
                  "compare": chart(h, slowest)})]


def _runbook(f: RunFacts, phase: str) -> str:
    lead = (f"{phase.capitalize()} slowed. Compare what changed since the baseline: the "
            "config (the fork page shows the difference to the parent), the software "
            "versions, the nodes (device/utilization per device shows a slow one).")
    if f.is_external:
        return lead
    problem = {"rollout": "straggler", "reward": "reward"}.get(phase)
    if phase == "learner" and f.config.placement.type == "disaggregated":
        problem = "learner"           # its levers are a disaggregated learner's
    if problem is not None:
        return levers.runbook(f.config, problem, lead)
    if phase == "weight_sync":
        return (f"{lead} Check the transport (weight_sync.type = "
                f"{f.config.weight_sync.type!r}): weight_sync/gb_per_s shows whether its "
                "bandwidth dropped.")
    return lead
