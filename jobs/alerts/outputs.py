"""The rules that read what the policy writes and what the learner makes of it, rather
than the loop's systems (jobs/alerts/rules.py keeps those and the RULES table):

    ImportanceWeightCollapse   tis/ratio_mean under ratio_mean_min (the batch
                               down-weighted) or tis/ess under ess_min (a few tokens
                               carry it): the ratio or the advantages, by tis/ess_ratio
    EntropyCollapse            learner/entropy under a floor or its early level / factor
                               while the reward stalls
    LengthBlowup               response_length/p99 at the cap, the truncated share rising
    NonTermination             most completions never emit the stop token; loops or not,
                               by response/repetition

The early level of a series is its mean over the first ``early_steps`` steps of the
history the rules see. A finding about what was written links the step of its worst
samples for the inspector (evidence "samples": {"step", "truncated"}; the alert's page
turns it into the inspector's URL).
"""

from __future__ import annotations

import statistics

from engine.api import metrics as M
from jobs.alerts.evidence import chart
from jobs.alerts.history import Finding, RunFacts, RunHistory, Thresholds
from jobs.alerts.inputs import reads
from jobs.alerts.knobs import lever
from jobs.alerts.levers import listed


def early_and_window(points: list[tuple[int, float]], early: int,
                     window: int) -> tuple[float, list[tuple[int, float]]] | None:
    """The mean of the first ``early`` points and the last ``window`` points, once the
    two do not overlap; else None."""
    if len(points) < early + window:
        return None
    return statistics.fmean(v for _, v in points[:early]), points[-window:]


def at(h: RunHistory, name: str, step: int) -> float | None:
    return h.metrics.get(name, {}).get(step)


# --------------------------------------------------------------------------- importance

@reads(metrics=(M.TIS_RATIO_MEAN, M.TIS_ESS, M.TIS_ESS_RATIO))
def importance_weight_collapse(h: RunHistory, f: RunFacts, t: Thresholds,
                               now: float) -> list[Finding]:
    pts = h.last(M.TIS_RATIO_MEAN, 1)
    if not pts:
        return []
    step, mean = pts[0]
    values = {name: at(h, name, step) for name in (
        M.TIS_ESS, M.TIS_ESS_RATIO, M.TIS_RATIO_MEAN, M.TIS_RATIO_MIN, M.TIS_RATIO_P01,
        M.TIS_CLIP_FRAC, M.LOGPROB_GAP_MEAN)}
    ess, alone = values[M.TIS_ESS], values[M.TIS_ESS_RATIO]
    down = mean < t.ratio_mean_min             # the whole batch weighs less
    thin = ess is not None and ess < t.ess_min  # a few tokens carry it
    if not down and not thin:
        return []
    what = []
    if down:
        what.append(f"is down-weighted {1 / max(mean, 1e-12):.3g}x (mean importance ratio "
                    f"{mean:.3g}, threshold {t.ratio_mean_min:g})")
    if thin:
        what.append(f"counts as {ess:.1%} of its tokens (effective sample size, threshold "
                    f"{t.ess_min:.0%})")
    shown = "; ".join(f"{name.split('/')[1]} {values[name]:.3g}" for name in
                      (M.TIS_RATIO_MEAN, M.TIS_RATIO_P01, M.TIS_RATIO_MIN)
                      if values[name] is not None)
    if down or (alone is not None and alone < t.ess_ratio_cause):
        key = "ratio"
        why = (f"the importance ratio pi_learner / pi_behaviour is the cause ({shown}"
               + (f"; the weights alone leave {alone:.0%} of the batch" if alone is not None
                  else "")
               + "): the rollout's logprobs disagree with the learner's on most tokens")
        runbook = _ratio_runbook(f)
    else:
        key = "advantage"
        why = (f"the advantages are the cause: the importance weights alone keep "
               f"{alone:.0%} of it ({shown}), but a few samples' advantages outweigh the "
               f"rest")
        runbook = _advantage_runbook(f)
    return [Finding(
        kind="ImportanceWeightCollapse", key=f"ImportanceWeightCollapse:{key}", step=step,
        cause=f"Step {step}'s batch {' and '.join(what)}: {why}.",
        runbook=runbook,
        evidence={"values": values, "series": chart(h, M.TIS_ESS if thin else M.TIS_RATIO_MEAN),
                  "compare": chart(h, M.TIS_RATIO_P01)})]


def _ratio_runbook(f: RunFacts) -> str:
    lead = ("Lowering the TIS cap does not help: it bounds weights from above and these "
            "are near 0. Compare the behaviour and learner logprobs per token in the "
            "inspector (largest gap first) and see LogprobGapHigh.")
    if f.is_external:
        return (f"{lead} Check that the inference engine returns logprobs of the sampling "
                "distribution (after temperature, never missing or filled with 0), its "
                "numerics against the trainer's, and how far generation runs ahead.")
    cfg, out = f.config, []
    if cfg.rollout.type == "vllm":
        out.append(f"check the engine's logprobs: rollout.logprobs_mode (now "
                   f"{cfg.rollout.logprobs_mode!r}) must be \"processed_logprobs\"")
    if cfg.model.dtype != "float32":
        out.append(f"rule out engine numerics: model.dtype {cfg.model.dtype!r} -> "
                   "\"float32\"")
    if cfg.async_policy.type != "sync":
        out.append(f'rule out staleness: async_policy.type {cfg.async_policy.type!r} -> '
                   '"sync" for a few steps')
    out.append("resume from the last checkpoint before the collapse once the cause is fixed")
    return listed(out, lead)


def _advantage_runbook(f: RunFacts) -> str:
    lead = "A few samples' advantages dominate the batch's gradient."
    if f.is_external:
        return (f"{lead} Draw more completions per prompt ("
                + lever(f.framework, "group_size", "the completions per prompt")
                + ") or train only on groups whose rewards differ ("
                + lever(f.framework, "filter_groups", "dynamic sampling") + ").")
    alg, out = f.config.algorithm, []
    out.append(f"more completions per prompt: algorithm.group_size {alg.group_size} -> "
               f"{min(alg.group_size * 2, 64)}")
    if not alg.dynamic_sampling:
        out.append("algorithm.dynamic_sampling = true: train only on groups whose rewards "
                   "differ")
    if getattr(alg, "normalize_std", False):
        out.append("algorithm.normalize_std = false: a group whose rewards barely differ "
                   "then no longer gets unit-scale advantages")
    return listed(out, lead)


# --------------------------------------------------------------------------- entropy

SOLVED = 0.95   # reward/accuracy at which a confident, uniform policy has learned its task

@reads(metrics=(M.LEARNER_ENTROPY, M.REWARD_MEAN))
def entropy_collapse(h: RunHistory, f: RunFacts, t: Thresholds, now: float) -> list[Finding]:
    found = early_and_window(h.series(M.LEARNER_ENTROPY), t.early_steps, t.entropy_window)
    if found is None:
        return []
    early, window = found
    limit = max(t.entropy_floor, early / t.entropy_factor)
    if any(v >= limit for _, v in window):
        return []
    first, (step, entropy) = window[0][0], window[-1]
    reward = h.series(M.REWARD_MEAN)
    before = [v for s, v in reward if s < first]
    during = [v for s, v in reward if s >= first]
    gain = statistics.fmean(during) - statistics.fmean(before) if before and during else 0.0
    flat = [v for s, v in h.series(M.SAMPLES_ZERO_STD_GROUP_FRAC) if s >= first]
    flat_share = statistics.fmean(flat) if flat else None
    agree = flat_share is not None and flat_share >= t.stuck_zero_std_frac
    if gain > t.entropy_reward_gain and not agree:
        return []                # sharper and still learning: not a collapse
    solved = [v for s, v in h.series(M.REWARD_ACCURACY) if s >= first]
    if solved and min(solved) >= SOLVED:
        return []                # sure because right: a task learned, not a collapse
    stall = f"the reward moved {gain:+.3f} against its mean before"
    if flat_share is not None:
        stall += f", {flat_share:.0%} of the groups had rewards that all agree"
    return [Finding(
        kind="EntropyCollapse", key="EntropyCollapse", step=step,
        cause=(f"Policy entropy collapsed: {entropy:.3g} nats/token at step {step}, under "
               f"{limit:.3g} (its early {early:.3g} / {t.entropy_factor:g}, floor "
               f"{t.entropy_floor:g}) for {len(window)} steps, while the reward stalls "
               f"({stall}): the completions of a group come out alike."),
        runbook=_entropy_runbook(f, first),
        evidence={"values": {M.LEARNER_ENTROPY: entropy, "early": early, "limit": limit,
                             "reward_gain": gain, M.SAMPLES_ZERO_STD_GROUP_FRAC: flat_share},
                  "series": chart(h, M.LEARNER_ENTROPY), "compare": chart(h, M.REWARD_MEAN)})]


def _entropy_runbook(f: RunFacts, since: int) -> str:
    lead = f"Resume from the last checkpoint before step {since} with the exploration back."
    if f.is_external:
        return (f"{lead} Raise " + lever(f.framework, "temperature", "the sampling temperature")
                + " or " + lever(f.framework, "kl_coef", "the KL penalty to the reference")
                + ", lower the learning rate, or raise the upper ratio clip (clip-higher).")
    cfg, out = f.config, []
    alg, temperature = cfg.algorithm, cfg.rollout.temperature
    if alg.clip_high <= alg.clip_low:
        out.append(f"clip-higher, so unlikely tokens with a positive advantage can grow: "
                   f"algorithm.clip_eps_high {alg.clip_high:g} -> {alg.clip_low + 0.08:g}")
    if temperature < 1.0:
        out.append(f"sample wider: rollout.temperature {temperature:g} -> "
                   f"{min(temperature + 0.2, 1.0):g}")
    out.append("hold the policy near the reference: algorithm.kl_coef = 0.01 (now 0)"
               if alg.kl_coef == 0 else
               f"algorithm.kl_coef {alg.kl_coef:g} -> {min(alg.kl_coef * 2, 10.0):g}")
    out.append(f"smaller updates: algorithm.lr {alg.lr:g} -> {alg.lr / 2:g}")
    return listed(out, lead)


# --------------------------------------------------------------------------- length

def samples_link(h: RunHistory, window: list[tuple[int, float]], name: str) -> dict:
    """The inspector's view of the window's worst step (the highest ``name``)."""
    worst = max(window, key=lambda p: (p[1], p[0]))[0]
    return {"step": worst, "truncated": True, "why": f"highest {name} of the window"}


@reads(metrics=(M.RESPONSE_LENGTH_P99, M.RESPONSE_TRUNCATED_FRAC), facts=("max_new_tokens",))
def length_blowup(h: RunHistory, f: RunFacts, t: Thresholds, now: float) -> list[Finding]:
    cap = f.max_new_tokens
    found = early_and_window(h.series(M.RESPONSE_TRUNCATED_FRAC), t.early_steps,
                             t.length_window)
    if cap is None or found is None:
        return []
    early, window = found
    p99 = h.metrics.get(M.RESPONSE_LENGTH_P99, {})
    if any(v < early + t.truncated_rise or p99.get(s, 0.0) < t.length_cap_share * cap
           for s, v in window):
        return []
    step, truncated = window[-1]
    return [Finding(
        kind="LengthBlowup", key="LengthBlowup", step=step,
        cause=(f"Completions are growing into the cap: at step {step} the p99 length is "
               f"{p99[step]:.0f} of {f.length_cap} {cap} and {truncated:.0%} are cut there "
               f"(early level {early:.0%}), for {len(window)} steps."),
        runbook=_length_runbook(f),
        evidence={"values": {M.RESPONSE_LENGTH_P99: p99[step], "cap": cap,
                             M.RESPONSE_TRUNCATED_FRAC: truncated, "early": early,
                             M.RESPONSE_LENGTH_MEAN: at(h, M.RESPONSE_LENGTH_MEAN, step)},
                  "series": chart(h, M.RESPONSE_TRUNCATED_FRAC),
                  "compare": chart(h, M.RESPONSE_LENGTH_P99),
                  "samples": samples_link(h, window, M.RESPONSE_TRUNCATED_FRAC)})]


def _length_runbook(f: RunFacts) -> str:
    lead = ("Read the truncated samples in the inspector: an answer that comes and the text "
            "runs on is NonTermination; a reasoning that needs more room is the cap.")
    if f.is_external:
        return (f"{lead} Penalize or filter overlong completions (DAPO's overlong shaping), "
                "or raise " + lever(f.framework, "max_new_tokens", "the completion cap")
                + " if the task needs it.")
    cfg, out = f.config, []
    if cfg.algorithm.overlong.type != "penalty":
        out.append('DAPO\'s soft length penalty: algorithm.overlong = {type = "penalty"} '
                   f"(now {cfg.algorithm.overlong.type!r})")
    if cfg.algorithm.overlong.type != "filter":
        out.append('keep cut completions out of the loss: algorithm.overlong = '
                   '{type = "filter"}')
    cap = f.max_new_tokens
    out.append(f"if the task needs the room: {f.length_cap} {cap} -> {min(cap * 2, 1024)}")
    return listed(out, lead)


@reads(metrics=(M.RESPONSE_TRUNCATED_FRAC,))
def non_termination(h: RunHistory, f: RunFacts, t: Thresholds, now: float) -> list[Finding]:
    found = early_and_window(h.series(M.RESPONSE_TRUNCATED_FRAC), t.early_steps,
                             t.length_window)
    if found is None:
        return []
    early, window = found
    if any(v < max(t.nonstop_frac, early + t.truncated_rise) for _, v in window):
        return []
    step, share = window[-1]
    repeats = [v for s, v in h.series(M.RESPONSE_REPETITION) if s >= window[0][0]]
    repetition = statistics.fmean(repeats) if repeats else None
    if repetition is not None and repetition > t.repetition_max:
        key = "loops"
        why = (f"degenerate loops: {repetition:.0%} of their {M.REPETITION_NGRAM}-token "
               f"n-grams repeat an earlier one")
        link = samples_link(h, [(s, v) for s, v in h.series(M.RESPONSE_REPETITION)
                                if s >= window[0][0]], M.RESPONSE_REPETITION)
    else:
        key = "no_stop"
        why = ("the text does not loop"
               + (f" ({repetition:.0%} repeated {M.REPETITION_NGRAM}-grams)"
                  if repetition is not None else "")
               + ": the stop token is not emitted, or not recognized as the end")
        link = samples_link(h, window, M.RESPONSE_TRUNCATED_FRAC)
    return [Finding(
        kind="NonTermination", key=f"NonTermination:{key}", step=step,
        cause=(f"{share:.0%} of step {step}'s completions never emitted the stop token "
               f"(early level {early:.0%}), for {len(window)} steps: {why}."),
        runbook=_non_termination_runbook(f, key),
        evidence={"values": {M.RESPONSE_TRUNCATED_FRAC: share, "early": early,
                             M.RESPONSE_REPETITION: repetition},
                  "series": chart(h, M.RESPONSE_TRUNCATED_FRAC),
                  "compare": chart(h, M.RESPONSE_REPETITION),
                  "samples": link})]


def _non_termination_runbook(f: RunFacts, key: str) -> str:
    if key == "no_stop":
        lead = ("Check the stop tokens: the tokenizer's EOS and the chat template's end of "
                "turn must both end generation (engine.model.stop_token_ids; an upgraded "
                "tokenizer or template changes them); the inspector's truncated samples show "
                "whether the answer came and the text ran on.")
    else:
        lead = ("The policy writes loops: see EntropyCollapse, and resume from a checkpoint "
                "before the loops began.")
    if f.is_external:
        return (f"{lead} Penalize overlong completions, or lower the learning rate.")
    cfg, out = f.config, []
    if cfg.algorithm.overlong.type == "none":
        out.append('penalize running on: algorithm.overlong = {type = "penalty"}')
    out.append(f"smaller updates: algorithm.lr {cfg.algorithm.lr:g} -> "
               f"{cfg.algorithm.lr / 2:g}")
    return listed(out, lead)
