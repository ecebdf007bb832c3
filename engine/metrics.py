"""The metric and phase vocabulary: every canonical name the engine reports, its unit and
what it means. The names are the contract between the engine that computes them and
everything that reads them (alert rules, charts, the compare page, the CLIs, Prometheus,
the browser through page data), so they are written here once and imported everywhere:

    from engine import metrics as M              # the engine; jobs/: engine.api.metrics
    m = {M.REWARD_MEAN: 0.4, M.PHASE_TIME.of(phase="rollout"): 1.2}
    h.last(M.STALENESS_MAX, 1)
    M.METRICS[M.BUBBLE].unit, M.METRICS[M.BUBBLE].meaning

A name is a plain ``str`` (``MetricName`` to a type checker), so the metrics dicts, the
events and the database hold exactly what they held before. A name with a part that
varies (a device, a phase) is a ``MetricFamily``; ``of(...)`` spells one member.

The README's metric table is generated from this module (``python -m engine.metrics``)
and a test checks it against it. Standard library only: the web process and the CLI
import it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NewType

MetricName = NewType("MetricName", str)


@dataclass(frozen=True)
class Metric:
    name: MetricName
    unit: str        # "s", "tokens", "fraction" (0..1), "count", ... ("" for a plain score)
    meaning: str


@dataclass(frozen=True)
class MetricFamily:
    """Names with a varying part: ``template`` is a str.format pattern with named fields."""
    template: str
    unit: str
    meaning: str

    def of(self, **fields: object) -> MetricName:
        return MetricName(self.template.format(**fields))

    def match(self, name: str) -> dict[str, str] | None:
        """The fields of a member's name ({"device": "gpu:0", ...}), or None for another
        name. A field holds no "/"."""
        pattern = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(self.template))
        found = re.fullmatch(pattern, name)
        return found.groupdict() if found else None


METRICS: dict[str, Metric] = {}       # name -> Metric, in the order defined here
FAMILIES: list[MetricFamily] = []


def _metric(name: str, unit: str, meaning: str) -> MetricName:
    if name in METRICS:
        raise ValueError(f"metric {name!r} defined twice")
    METRICS[name] = Metric(MetricName(name), unit, meaning)
    return MetricName(name)


def _family(template: str, unit: str, meaning: str) -> MetricFamily:
    family = MetricFamily(template, unit, meaning)
    FAMILIES.append(family)
    return family


# --- phases: what a span says a device was busy with ------------------------------------
# New phases go last: the run page's timeline indexes its traces by place in PHASES.
PHASE_MEANINGS = {
    "rollout": "generating completions (and their behaviour logprobs)",
    "reward": "scoring completions",
    "learner": "recomputing logprobs, computing the loss, the optimizer step",
    "weight_sync": "sending new weights to the rollout engines and loading them",
    "critic": "PPO's value model: values, GAE and its own optimizer step",
    "env": "a multi-turn task's environment: resetting it or stepping it with a model turn",
}
PHASES = tuple(PHASE_MEANINGS)                            # busy phases
WAITING = "waiting"   # an actor blocked on another; never counts as busy
IDLE = "idle"         # not a span's phase: the part of a device's wall time with no span

# --- reward ---------------------------------------------------------------------------------
REWARD_MEAN = _metric("reward/mean", "", "mean reward of the step's samples")
REWARD_STD = _metric("reward/std", "", "standard deviation of the step's rewards")
REWARD_MIN = _metric("reward/min", "", "lowest reward of the step's samples")
REWARD_MAX = _metric("reward/max", "", "highest reward of the step's samples")
REWARD_ACCURACY = _metric("reward/accuracy", "fraction", "share of samples rewarded 1.0")
EVAL_REWARD_MEAN = _metric("eval/reward_mean", "",
                           "mean reward on the held-out problems (eval steps only)")
EVAL_ACCURACY = _metric("eval/accuracy", "fraction",
                        "share of held-out problems rewarded 1.0 (eval steps only)")
EVAL_GREEDY_REWARD_MEAN = _metric("eval/greedy_reward_mean", "",
                                  "held-out mean reward at temperature 0 (eval steps only)")
EVAL_GREEDY_ACCURACY = _metric("eval/greedy_accuracy", "fraction",
                               "held-out accuracy at temperature 0 (eval steps only)")

# --- responses --------------------------------------------------------------------------
RESPONSE_LENGTH_MEAN = _metric("response_length/mean", "tokens", "mean response length")
RESPONSE_LENGTH_MIN = _metric("response_length/min", "tokens", "shortest response")
RESPONSE_LENGTH_MAX = _metric("response_length/max", "tokens", "longest response")
LENGTH_QUANTILES = (10, 25, 50, 75, 90, 95, 99)
RESPONSE_LENGTH_QUANTILE = {
    q: _metric(f"response_length/p{q}", "tokens", f"{q}th percentile of response length")
    for q in LENGTH_QUANTILES}
RESPONSE_LENGTH_P50 = RESPONSE_LENGTH_QUANTILE[50]
RESPONSE_LENGTH_P99 = RESPONSE_LENGTH_QUANTILE[99]
RESPONSE_LENGTH_GROUP_MAX_MEAN = _metric(
    "response_length/group_max_mean", "tokens",
    "mean over the step's groups of their longest response (a group completes with it)")
RESPONSE_FINISHED_FRAC = _metric("response/finished_frac", "fraction",
                                 "share of responses that ended on a stop token")
RESPONSE_TRUNCATED_FRAC = _metric("response/truncated_frac", "fraction",
                                  "share of responses cut at max_new_tokens")
REPETITION_NGRAM = 4   # response/repetition counts repeats of this many tokens
RESPONSE_REPETITION = _metric(
    "response/repetition", "fraction",
    f"mean over responses of the share of their {REPETITION_NGRAM}-token n-grams that "
    "repeat an earlier one of the same response (degenerate loops: near 1)")

# --- rollout and throughput -------------------------------------------------------------
ROLLOUT_GEN_S_P50 = _metric("rollout/gen_s_p50", "s",
                            "median generation time of a sample (call start -> its completion)")
ROLLOUT_GEN_S_P99 = _metric("rollout/gen_s_p99", "s", "p99 generation time of a sample")
ROLLOUT_GEN_S_MAX = _metric("rollout/gen_s_max", "s", "slowest sample's generation time")
ROLLOUT_WORKERS = _metric("rollout/workers", "workers",
                          "rollout workers generating at the step's end (set_rollout_workers "
                          "changes it live)")
ROLLOUT_TOKENS_PER_S = _metric("rollout/tokens_per_s", "tokens/s",
                               "response tokens per second of rollout time")
ROLLOUT_PREFIX_HIT_FRAC = _metric(
    "rollout/prefix_hit_frac", "fraction",
    "share of the context tokens of the step's multi-turn turns (each distinct context "
    "once) that the rollout engine served from its prefix cache instead of computing them: "
    "the torch sampler's (stored contexts; a first turn's prompt counts as fed) or vLLM's "
    "automatic prefix cache (whole KV blocks of any shared prefix)")
THROUGHPUT_TOKENS_PER_S = _metric("throughput/tokens_per_s", "tokens/s",
                                  "response tokens per second of step wall time")
THROUGHPUT_SAMPLES_PER_S = _metric("throughput/samples_per_s", "samples/s",
                                   "samples trained on per second of step wall time")

# --- where the step time goes (from spans) ----------------------------------------------
TIME_STEP_S = _metric("time/step_s", "s", "the step's wall time")
PHASE_TIME = _family("time/{phase}_s", "s",
                     "wall time any device spent in the phase (union of its spans)")
TIME_ROLLOUT_S = _metric(PHASE_TIME.of(phase="rollout"), "s", "wall time generating")
TIME_REWARD_S = _metric(PHASE_TIME.of(phase="reward"), "s", "wall time scoring")
TIME_LEARNER_S = _metric(PHASE_TIME.of(phase="learner"), "s", "wall time in the learner")
TIME_WEIGHT_SYNC_S = _metric(PHASE_TIME.of(phase="weight_sync"), "s",
                             "wall time syncing weights")
TIME_CRITIC_S = _metric(PHASE_TIME.of(phase="critic"), "s", "wall time in PPO's critic")
TIME_ENV_S = _metric(PHASE_TIME.of(phase="env"), "s",
                     "wall time in a multi-turn task's environment calls")
TIME_WAITING_S = _metric(PHASE_TIME.of(phase=WAITING), "s",
                         "wall time an actor waited on another (not busy)")
TIME_IDLE_S = _metric(PHASE_TIME.of(phase=IDLE), "s",
                      "mean over devices of the step time with no busy span")
ROLLOUT_SHARE = _metric("rollout_share", "fraction", "generation time / step wall time")
BUBBLE = _metric("bubble", "fraction",
                 "1 - busy device-time / (devices x wall time): the idle share")
DEVICE_UTILIZATION = _family("device/utilization/{device}", "fraction",
                             "a logical device's busy time / wall time (from spans)")
DEVICE_PHASE_UTILIZATION = _family("device/utilization/{device}/{phase}", "fraction",
                                   "a logical device's time in one phase / wall time")
DEVICE_GPU_UTIL = _family("device/gpu_util/{device}", "%", "measured GPU utilization (NVML)")
DEVICE_CPU_UTIL = _family("device/cpu_util/{device}", "%",
                          "measured CPU utilization of the device's process")
DEVICE_MEMORY_GB = _family("device/memory_gb/{device}", "GB",
                           "measured accelerator memory used (or the process's RSS)")
DEVICE_MEMORY_TOTAL_GB = _family("device/memory_total_gb/{device}", "GB",
                                 "the accelerator's total memory")
HOST_CORUN_SLOWDOWN = _family("host/corun_slowdown/{actor}", "ratio",
                              "an actor's (learner, rollout) speed alone / beside the others "
                              "computing at once, probed at the run's start on CPU devices")

# --- off-policy: staleness and the logprob gap ------------------------------------------
STALENESS_MEAN = _metric("staleness/mean", "versions",
                         "mean of (learner version at update - version that generated it)")
STALENESS_MAX = _metric("staleness/max", "versions", "largest staleness trained on")
LOGPROB_GAP_MEAN = _metric("logprob_gap/mean", "nats/token",
                           "mean absolute behaviour - learner logprob difference per token")
LOGPROB_GAP_MAX = _metric("logprob_gap/max", "nats/token", "largest token logprob gap")
LOGPROB_GAP_K3 = _metric("logprob_gap/k3", "nats/token",
                         "k3 estimate of the KL between behaviour and learner")
LOGPROB_GAP_UNTEMPERED_MEAN = _metric(
    "logprob_gap/untempered_mean", "nats/token",
    "the gap against the learner's T=1 logprobs (temperature != 1 only)")
PROB_GAP_MEAN = _metric("prob_gap/mean", "probability",
                        "mean absolute behaviour - learner token probability (not log) difference")
PROB_GAP_MAX = _metric("prob_gap/max", "probability",
                       "largest token probability difference, behaviour vs learner")
TIS_CLIP_FRAC = _metric("tis/clip_frac", "fraction",
                        "share of tokens whose importance weight hit algorithm.tis_cap")
TIS_RATIO_MEAN = _metric("tis/ratio_mean", "",
                         "mean over response tokens of the importance ratio "
                         "pi_learner / pi_behaviour (before algorithm.tis_cap)")
TIS_RATIO_MIN = _metric("tis/ratio_min", "", "smallest token importance ratio")
TIS_RATIO_P01 = _metric("tis/ratio_p01", "", "1st percentile of the token importance ratios")
TIS_ESS = _metric("tis/ess", "fraction",
                  "effective sample size of the batch as the loss weighs its tokens "
                  "(the capped importance weight times the absolute advantage): "
                  "(sum x)^2 / (n sum x^2) over the n tokens with an advantage; 1 = every "
                  "token counts alike")
TIS_ESS_RATIO = _metric("tis/ess_ratio", "fraction",
                        "the same effective sample size of the importance weights alone "
                        "(advantages left out): low = the ratio, not the advantage, "
                        "concentrates the batch")
MOE_ROUTING_AGREEMENT = _metric("moe/routing_agreement", "fraction",
                                "share of tokens the learner routed as the rollout did")

# --- samples and the buffer -------------------------------------------------------------
SAMPLES_ZERO_STD_GROUP_FRAC = _metric(
    "samples/zero_std_group_frac", "fraction",
    "share of the groups drawn whose rewards all agree (zero advantage)")
SAMPLES_RESAMPLED = _metric("samples/resampled", "samples",
                            "samples generated for groups dynamic sampling dropped")
SAMPLES_MIXED_VERSIONS = _metric("samples/mixed_versions", "samples",
                                 "samples generated across more than one policy version")
BUFFER_DROPPED_STALE = _metric("buffer/dropped_stale", "samples",
                               "samples dropped for staleness over the bound, so far")
BUFFER_RECYCLED = _metric("buffer/recycled", "groups",
                          "unfinished groups carried to a later step, so far")

# --- learner ------------------------------------------------------------------------------
LEARNER_LOSS = _metric("learner/loss", "", "the policy loss")
LEARNER_GRAD_NORM = _metric("learner/grad_norm", "", "gradient norm before clipping")
LEARNER_ENTROPY = _metric("learner/entropy", "nats/token", "policy entropy over responses")
LEARNER_KL_REF = _metric("learner/kl_ref", "nats/token", "k3 KL to the reference policy")
LEARNER_CLIP_FRAC = _metric("learner/clip_frac", "fraction",
                            "share of tokens whose ratio the surrogate clipped")
LEARNER_LR = _metric("learner/lr", "", "the learning rate this step used")
CRITIC_VALUE_LOSS = _metric("critic/value_loss", "", "PPO's clipped value loss")
CRITIC_GRAD_NORM = _metric("critic/grad_norm", "", "the critic's gradient norm")
CRITIC_VALUE_CLIP_FRAC = _metric("critic/value_clip_frac", "fraction",
                                 "share of values the value clip bound")
CRITIC_EXPLAINED_VARIANCE = _metric("critic/explained_variance", "",
                                    "1 - Var(returns - values) / Var(returns)")
CRITIC_VALUE_MEAN = _metric("critic/value_mean", "", "mean value over response tokens")
CRITIC_RETURN_MEAN = _metric("critic/return_mean", "", "mean GAE return")
CRITIC_LR = _metric("critic/lr", "", "the critic's learning rate")

# --- weight sync --------------------------------------------------------------------------
WEIGHT_SYNC_LATENCY_S = _metric(
    "weight_sync/latency_s", "s",
    "resync latency: learner's new version -> every rollout worker serves it")
WEIGHT_SYNC_BYTES = _metric("weight_sync/bytes", "bytes", "size of the weights synced")
WEIGHT_SYNC_WIRE_BYTES = _metric("weight_sync/wire_bytes", "bytes",
                                 "bytes the transport moved (a delta sync moves fewer)")
WEIGHT_SYNC_GB_PER_S = _metric("weight_sync/gb_per_s", "GB/s", "the sync's bandwidth")
WEIGHT_SYNC_VERSION_LEARNER = _metric("weight_sync/version_learner", "version",
                                      "the learner's weight version")
WEIGHT_SYNC_VERSION_ROLLOUT = _metric("weight_sync/version_rollout", "version",
                                      "the version the rollout engines report serving")
WEIGHT_SYNC_MATCHED = _metric("weight_sync/matched", "0/1",
                              "1 when the served version and fingerprint match the learner's")
WEIGHT_SYNC_VERIFIED = _metric("weight_sync/verified", "0/1",
                               "1 when this sync's fingerprints were computed")
WEIGHT_SYNC_DELTA_DENSITY = _metric("weight_sync/delta_density", "fraction",
                                    "share of parameters a delta sync sent")

# --- the reward service ---------------------------------------------------------------------
REWARD_SHARE = _metric("reward/share", "fraction", "reward phase time / step wall time")
REWARD_LATENCY_S_P50 = _metric("reward/latency_s_p50", "s", "median scoring latency")
REWARD_LATENCY_S_P99 = _metric("reward/latency_s_p99", "s", "p99 scoring latency")
REWARD_QUEUE_DEPTH = _metric("reward/queue_depth", "requests", "mean scoring queue depth")
REWARD_QUEUE_DEPTH_MAX = _metric("reward/queue_depth_max", "requests",
                                 "deepest scoring queue")
REWARD_BUSY_S = _metric("reward/busy_s", "s", "time the reward service spent scoring")
REWARD_ERROR_FRAC = _metric("reward/error_frac", "fraction",
                            "share of samples whose reward function raised (scored 0)")
REWARD_RM_MEAN = _metric("reward/rm_mean", "", "mean reward-model score")
REWARD_VERIFIER_MEAN = _metric("reward/verifier_mean", "",
                               "mean verifier score of the same samples, alongside the RM")
REWARD_RM_VS_VERIFIER_AGREEMENT = _metric("reward/rm_vs_verifier_agreement", "fraction",
                                          "share of samples the RM and the verifier agree on")
REWARD_OUTCOMES = _family("reward/{kind}/{reason}", "count",
                          "samples of a reward kind scored with that reason (sandbox: "
                          "timeout, memory, ...)")

# --- environments (task.type = "env": multi-turn trajectories) ------------------------------
ENV_TURNS_MEAN = _metric("env/turns_mean", "turns", "mean model turns per trajectory")
ENV_TURNS_MAX = _metric("env/turns_max", "turns", "most model turns in one trajectory")
ENV_STEP_S_P50 = _metric("env/step_s_p50", "s", "median environment call (reset or step)")
ENV_STEP_S_P99 = _metric("env/step_s_p99", "s", "p99 environment call (reset or step)")
ENV_ERRORS = _metric("env/errors", "calls",
                     "environment calls of the step's trajectories that raised (each ends "
                     "its trajectory)")
ENV_TIMEOUTS = _metric("env/timeouts", "calls",
                       "environment calls still running at task.env.step_timeout_s")
ENV_TOOL_CALLS = _metric("env/tool_calls", "calls",
                         "environment steps that ran a tool (their info said tool_call)")
EVAL_TOOL_CALL_FRAC = _metric("eval/tool_call_frac", "fraction",
                              "share of held-out trajectories that called a tool "
                              "(eval steps only)")

# --- the data ledger (engine/orchestration/ledger.py): counts so far in the run --------------
DATA_SERVED = _metric("data/served", "prompts",
                      "training prompts drawn for generation (each data position once; "
                      "a resume continues the checkpoint's count)")
DATA_TRAINED = _metric("data/trained", "prompts", "prompts whose group the learner trained on")
DATA_DROPPED = _metric("data/dropped", "prompts",
                       "prompts whose group was dropped (data/dropped/<reason>)")
DATA_DROPPED_BY = _family("data/dropped/{reason}", "prompts",
                          "prompts dropped for one reason: filter (dynamic sampling's flat "
                          "groups), stale (over the staleness bound), error")
DATA_EPOCH = _metric("data/epoch", "epoch",
                     "epoch of the latest prompt served (0-based; 0 for a synthetic task)")
DATA_SKIPPED = _metric("data/skipped", "prompts",
                       "data positions passed over without being served: a gap")
DATA_REPEATED = _metric("data/repeated", "prompts",
                        "prompts served or trained again after they were trained or dropped")

# --- runs reported by rlplane.track -----------------------------------------------------------
TRACK_DROPPED_NONFINITE = _metric(
    "track/dropped_nonfinite", "count",
    "metric values a script's rlplane.track dropped as NaN or infinite, so far in the run")


def markdown_table() -> str:
    """The README's metric table (between its ``metrics:begin`` / ``metrics:end`` marks)."""
    rows = ["| metric | unit | meaning |", "|---|---|---|"]
    rows += [f"| `{m.name}` | {m.unit} | {m.meaning} |" for m in METRICS.values()]
    rows += [f"| `{f.template}` | {f.unit} | {f.meaning} |" for f in FAMILIES]
    rows += ["", "| phase | meaning |", "|---|---|"]
    rows += [f"| `{p}` | {meaning} |" for p, meaning in PHASE_MEANINGS.items()]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
