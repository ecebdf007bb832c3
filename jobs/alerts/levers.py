"""The next levers a run does not already pull: runbooks read the run's own config.

    next_levers(cfg, "generation")  -> ["interruptible generation: set
                                        async_policy.over_provision = 1.5 (now 1) ...", ...]

A lever is one sentence naming the config field, its value now and the change. Each
problem lists its levers in the order worth trying; a lever the run already uses is left
out (a fully-async run is never told to go fully async), and a run whose placement cannot
overlap anything (the in-process default) is told to go on Ray first. A lever carries no
predicted gain of its own: the planner's prediction (engine/planner/, asked through
jobs/alerts/whatif.py) follows the levers in BubbleHigh's runbook, and the fork and compare
pages show its table (jobs/queries/planning.py).
"""

from __future__ import annotations

from engine.api import metrics as M
from engine.config import RunConfig

# problem -> what it is about, for the runbook's wording
PROBLEMS = ("generation", "straggler", M.BUBBLE, "reward", "resync_wait", "learner")
# (the bubble problem is named for the metric it is about)


def _async_levers(cfg: RunConfig, problem: str) -> list[str]:
    p, out = cfg.async_policy, []
    if p.type == "sync":
        if problem == "straggler":
            out.append('partial rollout: async_policy.type = "partial_rollout" (the step '
                       "stops once its groups are complete; stragglers continue next step)")
        out.append('overlap generation with learning: async_policy.type = "one_step_off" '
                   '(staleness 1) or "fully_async" with max_staleness')
        if problem != "straggler":
            out.append('partial rollout: async_policy.type = "partial_rollout"')
    elif p.type == "one_step_off":
        if problem == "straggler":
            out.append('partial rollout: async_policy.type = "partial_rollout" (stragglers '
                       "continue next step instead of holding this one)")
        out.append('async_policy.type = "fully_async" with max_staleness = 2: workers '
                   "generate continuously instead of one step ahead")
    elif p.type == "partial_rollout":
        if not p.overlap and problem != "straggler":
            out.append("generate the next step during the update: async_policy.overlap = "
                       f"true (with max_staleness >= 2; now {p.max_staleness})")
        if p.over_provision < 8.0:
            out.append(f"start more prompts per step: async_policy.over_provision "
                       f"{p.over_provision:g} -> {min(p.over_provision * 1.5, 8.0):g}")
        if p.max_staleness < 64:
            out.append(f"keep recycled groups longer: async_policy.max_staleness "
                       f"{p.max_staleness} -> {p.max_staleness + 1}")
        out.append('async_policy.type = "fully_async": workers generate continuously')
    else:  # fully_async
        if p.over_provision <= 1.0:
            out.append("interruptible generation: async_policy.over_provision = 1.5 (now 1): "
                       "a call stops once its groups are complete and continues the rest "
                       "next call, under newer weights")
        elif p.over_provision < 8.0:
            out.append(f"more interruptible generation: async_policy.over_provision "
                       f"{p.over_provision:g} -> {min(p.over_provision * 1.5, 8.0):g}")
        if problem == "resync_wait":
            out.append("smaller generate calls, so a worker takes new weights sooner: "
                       "async_policy.prompts_per_call "
                       + (f"{p.prompts_per_call} -> {max(p.prompts_per_call // 2, 1)}"
                          if p.prompts_per_call else "= half of the even split (now 0)"))
        elif p.max_staleness < 64:
            out.append(f"let workers run further ahead: async_policy.max_staleness "
                       f"{p.max_staleness} -> {p.max_staleness + 1}"
                       + (' (or on_stale = "drop": workers never wait)'
                          if p.on_stale == "wait" else ""))
    return out


def _placement_lever(cfg: RunConfig) -> str:
    pl = cfg.placement
    if pl.type == "colocated" and not pl.ray:
        ray = ('placement.ray = true or placement.type = "disaggregated" (Ray actors on '
               'devices of their own)')
        if pl.overlap_threads and pl.overlap_share == "idle":
            return ('give generation cores of its own when the learner waits for experience: '
                    'placement.overlap_share = "split" (the rollout thread now runs on the '
                    "cycles the update leaves idle); or run on Ray: " + ray)
        if pl.overlap_threads:
            return (f"move cores between the sides: placement.overlap_threads "
                    f"{pl.overlap_threads} -> {pl.overlap_threads + 1} when the learner "
                    f"waits for experience, -> {max(pl.overlap_threads - 1, 1)} when "
                    f"generation waits for the update; or run on Ray: {ray}")
        return ("run on Ray so generation can overlap training: " + ray + ", or in this "
                "process: placement.overlap_threads = 1 with an overlapping async policy "
                "(the rollout worker on a thread of its own; without it every async policy "
                "keeps its schedule without overlap)")
    if pl.type == "colocated":
        return (f'more rollout devices: placement.devices {pl.devices} -> {pl.devices + 1}, '
                'or placement.type = "disaggregated" so generation never waits for the '
                "learner's share of a device")
    return (f"more rollout workers: placement.rollout_workers {pl.rollout_workers} -> "
            f"{pl.rollout_workers + 1}")


def next_levers(cfg: RunConfig, problem: str) -> list[str]:
    """The levers for ``problem`` (one of PROBLEMS) this run does not already use."""
    if problem not in PROBLEMS:
        raise ValueError(f"unknown problem {problem!r}; one of {PROBLEMS}")
    if problem == "reward":
        out = []
        if cfg.reward.workers == 0:
            out.append("score as completions finish: reward.workers = 2 (a pool of reward "
                       "actors fed while the rest still generate)")
        else:
            out.append(f"more reward workers: reward.workers {cfg.reward.workers} -> "
                       f"{min(cfg.reward.workers * 2, 64)}")
        if cfg.async_policy.type == "sync":
            out.append('overlap reward with generation: async_policy.type = "one_step_off"')
        return [*out, "speed up the verifier itself"]
    if problem == "learner":                # disaggregated: the generator waits
        pl, alg, out = cfg.placement, cfg.algorithm, []
        out.append(f"shard the learner over more devices: placement.learner_devices "
                   f"{pl.learner_devices} -> {pl.learner_devices * 2}")
        if alg.epochs * alg.minibatches > 1:
            out.append(f"one optimizer step per batch: algorithm.minibatches "
                       f"{alg.minibatches} -> 1" + (f", epochs {alg.epochs} -> 1"
                                                    if alg.epochs > 1 else "")
                       + " (its forward then gives the old logprobs: no separate "
                         "recompute)")
        if pl.rollout_workers > 1:
            out.append(f"fewer rollout workers: placement.rollout_workers "
                       f"{pl.rollout_workers} -> {pl.rollout_workers - 1}")
        return out
    in_process = cfg.placement.type == "colocated" and not cfg.placement.ray
    out = [_placement_lever(cfg)] if in_process else []   # overlap: Ray or overlap_threads
    out += _async_levers(cfg, problem)
    if not in_process and problem != "resync_wait":
        out.append(_placement_lever(cfg))
    if problem in ("generation", "straggler"):
        out.append(f"cap the long tail: rollout.max_new_tokens {cfg.rollout.max_new_tokens} "
                   f"-> {max(cfg.rollout.max_new_tokens * 3 // 4, 1)}")
    if problem == "straggler":
        out.append("check the rollout workers for a slow one (their device/utilization)")
    return out


def runbook(cfg: RunConfig, problem: str, lead: str = "") -> str:
    """``lead`` then the levers, numbered: 'Next levers: (1) ...; (2) ....'"""
    return listed(next_levers(cfg, problem), lead)


def listed(levers: list[str], lead: str = "") -> str:
    """``lead`` then ``levers`` (each one the run does not already use), numbered."""
    items = "; ".join(f"({i}) {lever}" for i, lever in enumerate(levers, start=1))
    return (f"{lead} " if lead else "") + f"Next levers, not yet used by this run: {items}."
