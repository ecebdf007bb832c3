"""What the rules read: a run's recent history, built from event payloads in seq order.

    h = RunHistory()
    for payload in events: h.add(payload)        # metrics.append, span, weight_sync.report
    h.series("reward/mean")  -> [(step, value), ...] by step
    h.syncs[-1].version_rollout, h.spans[-1].phase   # the engine's typed events
    evaluate(h, RunFacts.from_config(cfg, status), Thresholds(), now)   (rules.py)

The ingest path builds it from stored RunEvents and the engine tests from a MemorySink:
the same payloads, the same evaluation. Nothing here touches the database.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from engine.api import MetricsEvent, SpanEvent, WeightSyncEvent, event_from_dict
from engine.api import metrics as M
from engine.config import NATIVE, RunConfig

HISTORY_EVENTS = ("metrics.append", "span", "weight_sync.report")


class RunHistory:
    def __init__(self) -> None:
        self.metrics: dict[str, dict[int, float]] = {}
        self.syncs: list[WeightSyncEvent] = []
        self.spans: list[SpanEvent] = []
        self.last_ts = 0.0
        self.step_ts: dict[int, float] = {}   # when each step's first metrics arrived
        self.last_span: SpanEvent | None = None   # the span that ended last
        self.spans_of_step: dict[int, int] = {}   # how many spans each step has sent
        self._steps: tuple[int, int, list[int]] = (0, 0, [])   # steps, sorted per new step
        # What a rule derives at some cost from the whole history (the planner's what-if),
        # kept while its inputs are unchanged: evaluate() runs at every event, most of
        # which (spans, syncs) leave those inputs as they were.
        self._derived: dict[str, tuple[Any, Any]] = {}
        # Each event added, lightly (keep_last): (ts, step, the names it gave a value) of a
        # metrics event, (ts, event) of a span or a sync, (ts, None) of any other.
        self._held: deque[tuple] = deque()
        self._name_sets: dict[tuple[str, ...], tuple[str, ...]] = {}   # one tuple per set

    @classmethod
    def of(cls, payloads: Iterable[dict[str, Any]]) -> RunHistory:
        """A history of stored event payloads, in seq order."""
        h = cls()
        for payload in payloads:
            h.add(payload)
        return h

    def derived(self, name: str, inputs: Any, compute: Callable[[], Any]) -> Any:
        """``compute()``, or what it returned last for ``name`` if that was for equal
        ``inputs`` (a key that changes whenever what ``compute`` reads does)."""
        kept = self._derived.get(name)
        if kept is not None and kept[0] == inputs:
            return kept[1]
        value = compute()
        self._derived[name] = (inputs, value)
        return value

    def add(self, payload: dict[str, Any]) -> None:
        """One event as stored (``Event.to_dict()``, NaN metric values as None)."""
        event = event_from_dict(payload)
        self.last_ts = max(self.last_ts, event.ts)
        if isinstance(event, MetricsEvent):
            self.step_ts[event.step] = min(event.ts, self.step_ts.get(event.step, event.ts))
            given = []
            for name, value in event.values.items():
                if value is not None:
                    self.metrics.setdefault(name, {})[event.step] = value
                    given.append(name)
            names = tuple(given)
            self._held.append((event.ts, event.step, self._name_sets.setdefault(names, names)))
            return
        if isinstance(event, SpanEvent):
            self._add_span(event)
        elif isinstance(event, WeightSyncEvent):
            self.syncs.append(event)
        self._held.append((event.ts, event if isinstance(event, SpanEvent | WeightSyncEvent)
                           else None))

    def _add_span(self, event: SpanEvent) -> None:
        self.spans.append(event)
        self.spans_of_step[event.step] = self.spans_of_step.get(event.step, 0) + 1
        if self.last_span is None or event.end > self.last_span.end:
            self.last_span = event

    def keep_last(self, n: int) -> None:
        """Forget all but the last ``n`` events added: what RunHistory.of those n payloads
        would be, without decoding them again. A (name, step) value stays where a kept
        event gave it one: the value there is the latest such event's, as before (the
        forgotten events are older than every kept one)."""
        while len(self._held) > n:
            self._held.popleft()
        metrics, self.metrics = self.metrics, {}
        self.syncs, self.spans, self.last_span = [], [], None
        self.step_ts, self.spans_of_step, self.last_ts = {}, {}, 0.0
        self._steps, self._derived, self._name_sets = (0, 0, []), {}, {}
        for held in self._held:
            self.last_ts = max(self.last_ts, held[0])
            if len(held) == 3:
                ts, step, names = held
                self._name_sets.setdefault(names, names)
                self.step_ts[step] = min(ts, self.step_ts.get(step, ts))
                for name in names:
                    self.metrics.setdefault(name, {})[step] = metrics[name][step]
            elif isinstance(held[1], SpanEvent):
                self._add_span(held[1])
            elif isinstance(held[1], WeightSyncEvent):
                self.syncs.append(held[1])

    def series(self, name: str) -> list[tuple[int, float]]:
        return sorted(self.metrics.get(name, {}).items())

    def last(self, name: str, n: int) -> list[tuple[int, float]]:
        return self.series(name)[-n:]

    @property
    def steps(self) -> list[int]:
        """Training steps reported so far (eval-only metric events carry no reward/mean).
        Sorted once per new step: the rules read it at every event (a multi-turn run
        sends thousands of spans), and a fresh sort each time made their cost quadratic."""
        rewards = self.metrics.get(M.REWARD_MEAN, {})
        if self._steps[:2] != (id(rewards), len(rewards)):    # steps only ever arrive
            self._steps = (id(rewards), len(rewards), sorted(rewards))
        return self._steps[2]


# An external run's parameters that give its staleness bound (prime-rl's
# max_async_level; a script's own name for it), looked up at the top level of params.
STALENESS_PARAMS = ("staleness_bound", "max_staleness", "max_async_level", "async_level")
# ... and its completion cap (TRL, veRL, OpenRLHF, prime-rl, a script).
MAX_TOKENS_PARAMS = ("max_new_tokens", "max_completion_length", "max_response_length",
                     "generate_max_len", "max_tokens")


@dataclass(frozen=True)
class Baseline:
    """ThroughputRegression's reference: medians over a run's first healthy steps."""
    samples_per_s: float              # generated: trained on plus resampled
    step_s: float
    phases: dict[str, float]           # time/<phase>_s -> seconds
    length: float | None               # response_length/mean, or None if not logged
    source: str                        # "steps 1-3 of this run", "run #12's steps 1-3",
                                       # "the marked baseline, run #9's steps 1-3"


def _number(params: dict, keys: tuple[str, ...]) -> float | None:
    for key in keys:
        value = params.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return value
    return None


@dataclass(frozen=True)
class RunFacts:
    """What the rules need to know about the run besides its series. On an external run a
    fact its parameters do not give is None, and the rules that need it are not evaluated
    (jobs/alerts/inputs.py) rather than run against a guess."""
    status: str = "running"              # the control plane's RunStatus value, or "paused"
    temperature: float | None = 1.0
    staleness_bound: int | None = 0      # sync loop: every sample is on-policy
    async_policy: str = "sync"
    config: RunConfig = field(default_factory=RunConfig)   # the runbooks' levers read it
    framework: str = "rlplane"           # who trains the run: its engine, or an external one
    params: dict = field(default_factory=dict)   # an external run's own parameters
    # the cap on a response's length (LengthBlowup): rollout.max_new_tokens, or for a
    # multi-turn task the trajectory's budget (task.env.max_tokens: turns and observations)
    max_new_tokens: int | None = None
    # ThroughputRegression's baseline as stored (a run an operator marked, a fork's
    # parent's, the run's first steps: lifecycle.baseline_for); None: from the history's
    # first steps
    baseline: Baseline | None = None
    # The driver's restarts as Run.restarts keeps them (jobs/runs/restart.py), and how
    # many the config allows: DriverRestarted reads them
    restarts: tuple[dict, ...] = ()
    max_restarts: int = 0

    @property
    def is_external(self) -> bool:
        """Another framework trains the run: ``config`` is a placeholder, so runbooks
        name that framework's knobs (jobs/alerts/knobs.py), never a RunConfig field."""
        return self.framework != NATIVE

    @property
    def length_cap(self) -> str:
        """The setting ``max_new_tokens`` stands for, as the run's config names it."""
        if self.is_external:
            return "max_new_tokens"
        return ("task.env.max_tokens" if self.config.task.type == "env"
                else "rollout.max_new_tokens")

    @classmethod
    def of(cls, run, status: str) -> RunFacts:
        """The facts of a jobs Run (native or external) in ``status``."""
        if not run.is_external:
            return replace(cls.from_config(run.run_config, status),
                           restarts=tuple(run.restarts), max_restarts=run.max_restarts)
        params = run.external_config.params
        temperature = _number(params, ("temperature",))
        bound = _number(params, STALENESS_PARAMS)
        cap = _number(params, MAX_TOKENS_PARAMS)
        return cls(status=status, async_policy="external", framework=run.framework,
                   params=params, temperature=None if temperature is None else float(temperature),
                   staleness_bound=None if bound is None else int(bound),
                   max_new_tokens=None if cap is None else int(cap))

    @classmethod
    def from_config(cls, cfg: RunConfig, status: str) -> RunFacts:
        bound = cfg.async_policy.staleness_bound
        return cls(status=status, temperature=cfg.rollout.temperature, staleness_bound=bound,
                   async_policy=cfg.async_policy.type, config=cfg,
                   max_new_tokens=(cfg.task.env.max_tokens if cfg.task.type == "env"
                                   else cfg.rollout.max_new_tokens))


class Thresholds(BaseModel):
    """Alert thresholds: defaults here, overridden per preset by an operator."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)

    desync_version_lag: int = Field(default=1, ge=0, le=1000)
    """WeightSyncDesync when the rollout's version lags the learner's by more than this."""
    stuck_window: int = Field(default=20, ge=4, le=10_000)
    """Steps over which StuckReward fits the reward slope."""
    stuck_slope: float = Field(default=0.002, ge=0.0, le=1.0)
    """|reward slope| per step below which the reward counts as stuck."""
    stuck_std: float = Field(default=0.02, ge=0.0, le=10.0)
    """StuckReward without a systems cause, for a run that does not log
    samples/zero_std_group_frac, fires only while reward/std stays below this (no learning
    signal); a flat but varying reward is slow learning, not stuck."""
    stuck_zero_std_frac: float = Field(default=0.8, ge=0.0, le=1.0)
    """StuckReward without a systems cause fires only while, on average over the window,
    at least this share of each step's groups had rewards that all agree
    (samples/zero_std_group_frac): their advantages are 0, so the learner gets no signal."""
    gap_high: float = Field(default=0.1, gt=0.0, le=100.0)
    """LogprobGapHigh when logprob_gap/mean exceeds this (nats per token)."""
    temperature_gap: float = Field(default=0.02, gt=0.0, le=100.0)
    """TemperatureLogprobs: the least gap right after a sync that counts as a mismatch."""
    drift_window: int = Field(default=5, ge=3, le=1000)
    """LogprobGapDrift: steps of monotone gap rise with unchanged learner weights."""
    drift_min: float = Field(default=0.01, ge=0.0, le=100.0)
    """LogprobGapDrift: the least total rise over the window."""
    hang_factor: float = Field(default=10.0, ge=1.0, le=10_000.0)
    """PhaseHang after this many times the median duration of the phase in progress."""
    hang_min_s: float = Field(default=60.0, ge=0.0, le=86_400.0)
    """PhaseHang never fires before this many seconds without progress."""
    bubble_max: float = Field(default=0.3, gt=0.0, le=1.0)
    """BubbleHigh when the bubble stays above this."""
    rollout_share_max: float = Field(default=0.85, gt=0.0, le=1.0)
    """BubbleHigh when the rollout share of the step stays above this."""
    reward_share_max: float = Field(default=0.9, gt=0.0, le=1.0)
    """BubbleHigh when the reward stage's share of the step stays above this."""
    straggler_p99_p50: float = Field(default=5.0, ge=1.0, le=10_000.0)
    """BubbleHigh names stragglers when the p99 of a step's per-sample generation times
    (rollout/gen_s_p99) is over this many times their p50 (and over straggler_min_s)."""
    straggler_factor: float = Field(default=10.0, ge=1.0, le=10_000.0)
    """Without per-sample times: BubbleHigh when generation time stays above this many
    times the run's median..."""
    straggler_min_s: float = Field(default=5.0, ge=0.0, le=86_400.0)
    """... and above this many seconds."""
    bubble_window: int = Field(default=2, ge=1, le=1000)
    """Consecutive steps a BubbleHigh condition must hold."""
    resync_factor: float = Field(default=5.0, ge=1.0, le=10_000.0)
    """ResyncSlow when resync latency exceeds this many times the run's median."""
    resync_min_s: float = Field(default=2.0, ge=0.0, le=86_400.0)
    """ResyncSlow never fires below this latency."""
    resync_wait_share: float = Field(default=0.5, gt=0.0, le=1.0)
    """ResyncSlow names waiting for in-flight generation as the cause when at least this
    share of the latency was a rollout worker finishing its generation (from its spans)."""
    overopt_window: int = Field(default=10, ge=3, le=10_000)
    """RewardOverOptimization: steps over which the training reward's rise is compared
    with the verifier's running alongside (reward/verifier_mean); the held-out reward
    (eval/reward_mean) is compared over its last this-many evaluations (at least 3)."""
    overopt_min_rise: float = Field(default=0.1, gt=0.0, le=1000.0)
    """RewardOverOptimization: the least rise of the training reward over the window (by
    its least-squares slope) that counts as "keeps rising" against the held-out reward;
    against the verifier alongside, the least amount by which the training reward
    (rising or holding) outgrows the verifier."""
    overopt_follow: float = Field(default=0.25, ge=0.0, le=1.0)
    """RewardOverOptimization: the verifier or held-out reward stalls when its rise over
    the same steps is below this share of the training reward's."""
    overopt_agreement_min: float = Field(default=0.6, ge=0.0, le=1.0)
    """RewardOverOptimization when reward/rm_vs_verifier_agreement, averaged over the last
    3 steps, is below this: the reward model and the verifier disagree on most samples."""
    reward_error_frac: float = Field(default=0.1, ge=0.0, le=1.0)
    """RewardErrors when more than this share of a step's samples failed in the reward
    function (reward/error_frac)."""
    env_errors: int = Field(default=0, ge=0, le=1_000_000)
    """EnvErrors when more than this many of a step's environment calls raised
    (env/errors)."""
    env_share: float = Field(default=0.5, gt=0.0, le=1.0)
    """EnvHang when environment calls take more than this share of a step's wall time
    (time/env_s / time/step_s) and more than env_rise times their median over the run's
    earlier steps (at least 3 of them), or any call ran past task.env.step_timeout_s."""
    env_rise: float = Field(default=2.0, gt=1.0, le=1000.0)
    """How many times the run's usual environment time (the median of its earlier steps'
    time/env_s) a step's must reach for its share to count towards EnvHang: an
    environment slow by nature (a code sandbox) holds most of every step, healthy."""
    early_steps: int = Field(default=2, ge=1, le=1000)
    """The run's first this-many steps give the early level that EntropyCollapse,
    LengthBlowup and NonTermination compare with."""
    ess_min: float = Field(default=0.1, gt=0.0, le=1.0)
    """ImportanceWeightCollapse when the batch's effective sample size as the loss weighs
    its tokens (tis/ess, a share of the tokens that carry an advantage) is under this."""
    ratio_mean_min: float = Field(default=0.5, gt=0.0, le=1.0)
    """ImportanceWeightCollapse also when the mean importance ratio (tis/ratio_mean) is
    under this: the whole batch is down-weighted, which leaves its ESS whole."""
    ess_ratio_cause: float = Field(default=0.5, gt=0.0, le=1.0)
    """ImportanceWeightCollapse names the importance ratio as the cause when the
    importance weights alone (tis/ess_ratio) leave less than this share; else the
    advantages concentrate the batch."""
    entropy_floor: float = Field(default=0.01, ge=0.0, le=100.0)
    """EntropyCollapse when learner/entropy stays under this (nats/token) ..."""
    entropy_factor: float = Field(default=10.0, ge=1.0, le=1e6)
    """... or under its early level divided by this, ..."""
    entropy_window: int = Field(default=2, ge=1, le=1000)
    """... for this many steps, while the reward stalls: its mean over them is no more
    than entropy_reward_gain above its mean before, or most groups' rewards all agree
    (stuck_zero_std_frac)."""
    entropy_reward_gain: float = Field(default=0.05, ge=0.0, le=1000.0)
    """EntropyCollapse: the least rise of the reward that counts as not stalled."""
    length_window: int = Field(default=2, ge=1, le=1000)
    """LengthBlowup and NonTermination: steps their condition must hold."""
    length_cap_share: float = Field(default=0.9, gt=0.0, le=1.0)
    """LengthBlowup when response_length/p99 reaches this share of the completion cap
    (rollout.max_new_tokens; a multi-turn task's task.env.max_tokens) ..."""
    truncated_rise: float = Field(default=0.2, ge=0.0, le=1.0)
    """... and the truncated share (response/truncated_frac) rose by at least this over
    its early level (NonTermination needs the same rise)."""
    nonstop_frac: float = Field(default=0.5, gt=0.0, le=1.0)
    """NonTermination when at least this share of the completions never emitted the stop
    token (response/truncated_frac)."""
    repetition_max: float = Field(default=0.5, gt=0.0, le=1.0)
    """NonTermination names degenerate loops when response/repetition is over this."""
    throughput_tolerance: float = Field(default=0.1, gt=0.0, le=0.99)
    """ThroughputRegression when samples/s falls more than this share under the
    baseline (the run's first healthy steps, or a fork's parent's) ..."""
    throughput_min_s: float = Field(default=3.0, ge=0.0, le=86_400.0)
    """... and each step takes this many seconds longer (on a shared host the timing
    noise of a short step reaches a second or two; a 30 s step's 10 % is 3 s) ..."""
    throughput_window: int = Field(default=2, ge=1, le=1000)
    """... for this many steps in a row."""
    throughput_baseline_steps: int = Field(default=3, ge=1, le=1000)
    """ThroughputRegression's own baseline: the median of this many steps after the
    run's first (where a pipeline fills and kernels compile)."""


@dataclass
class Finding:
    """One alert condition that holds now."""
    kind: str
    key: str                    # dedup key: one open alert per (run, key)
    cause: str                  # one sentence
    runbook: str                # what to check, which config field to change
    step: int | None
    evidence: dict[str, Any] = field(default_factory=dict)   # {"values": {}, "series": {}}
