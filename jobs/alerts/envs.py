"""The rules of a multi-turn task's environment (task.type = "env"): EnvErrors when its
calls raise, EnvHang when it, not generation, holds the step (calls past their timeout, or
most of the step's wall time spent in environment calls that have grown well past the
run's own usual). Runs without an environment
report no env/* metrics and raise neither."""

from __future__ import annotations

from engine.api import metrics as M
from jobs.alerts.evidence import chart
from jobs.alerts.history import Finding, RunFacts, RunHistory, Thresholds
from jobs.alerts.inputs import reads


@reads(metrics=(M.ENV_ERRORS,))
def env_errors(h: RunHistory, f: RunFacts, t: Thresholds, now: float) -> list[Finding]:
    pts = h.last(M.ENV_ERRORS, 1)
    if not pts or pts[0][1] <= t.env_errors:
        return []
    step, n = pts[0]
    return [Finding(
        kind="EnvErrors", key="EnvErrors", step=step,
        cause=(f"The environment raised in {n:.0f} of step {step}'s calls: each ended its "
               f"trajectory (reason env_error) with the reward it had so far, so the policy "
               f"learns from cut trajectories, not from your environment."),
        runbook=("Read the environment's error in the run's log (each distinct one is "
                 "logged once) and fix the class task.env.class names: reset(row) -> "
                 "messages, step(text) -> StepResult or (observations, reward, done, info), "
                 "either may be async. env/errors counts the failed calls."),
        evidence={"values": {M.ENV_ERRORS: n, "threshold": t.env_errors},
                  "series": chart(h, M.ENV_ERRORS)})]


@reads(metrics=(M.ENV_TIMEOUTS, M.TIME_ENV_S, M.TIME_STEP_S))
def env_hang(h: RunHistory, f: RunFacts, t: Thresholds, now: float) -> list[Finding]:
    pts = h.last(M.ENV_TIMEOUTS, 1)
    if not pts:
        return []
    step, timeouts = pts[0]
    env_s = h.metrics.get(M.TIME_ENV_S, {}).get(step, 0.0)
    step_s = h.metrics.get(M.TIME_STEP_S, {}).get(step, 0.0)
    share = env_s / step_s if step_s > 0 else 0.0
    # An environment that is slow by nature (a sandbox running each turn's program) holds
    # most of every step from the start: only a share that grew with the environment's
    # time, against the run's own earlier steps, says it started to hang.
    before = sorted(v for s, v in h.metrics.get(M.TIME_ENV_S, {}).items() if s < step)[-20:]
    usual = before[len(before) // 2] if len(before) >= 3 else None
    grew = usual is not None and env_s > t.env_rise * usual
    if timeouts <= 0 and not (share > t.env_share and grew):
        return []
    return [Finding(
        kind="EnvHang", key="EnvHang", step=step,
        cause=(f"The environment, not generation, holds step {step}: {timeouts:.0f} calls "
               f"ran past task.env.step_timeout_s and environment calls took {share:.0%} "
               f"of its wall time ({env_s:.2f} s of {step_s:.2f} s)."),
        runbook=("Look at what the environment waits on (a tool server, a sandbox, the "
                 "network): env/step_s_p99 shows its tail and the env spans on the run's "
                 "timeline where it sits. A call past task.env.step_timeout_s ends its "
                 "trajectory: lower the timeout so a hung call costs less, or make step "
                 "async so a slow call does not hold the rest."),
        evidence={"values": {M.ENV_TIMEOUTS: timeouts, "env_share": share,
                             "threshold": t.env_share, "usual_env_s": usual},
                  "series": chart(h, M.TIME_ENV_S)})]
