"""Config sections of fault injection (the failure modes the alerts must name)."""

from __future__ import annotations

from pydantic import Field

from engine.config._base import _Section

# --------------------------------------------------------------------------- faults

class SkipWeightSyncFault(_Section):
    """The learner believes it synced; the rollout engine is told the new version but keeps
    serving the old weights (its own fingerprint then differs from the learner's)."""

    from_step: int = Field(default=0, ge=0, le=1_000_000)
    """First step whose weight sync is skipped."""
    every: int = Field(default=1, ge=1, le=1000)
    """From from_step on, skip every k-th sync (1 = every sync)."""


class SleepDropsWeightsFault(_Section):
    """On wake (every sync from from_step on), the rollout restores the weights it held at
    the run's first sync, under the new version's number (TRL #5312)."""

    from_step: int = Field(default=0, ge=0, le=1_000_000)
    """First step whose wake restores the old weights."""


class UnscaledLogprobsFault(_Section):
    """Behaviour logprobs are returned without temperature scaling (TRL #4159); sampling
    itself stays tempered. Torch rollout only (vLLM: rollout.logprobs_mode = "raw_logprobs")."""

    from_step: int = Field(default=1, ge=1, le=1_000_000)
    """First step whose rollout returns untempered logprobs (>= 1: the start-up preflight
    would refuse the run before step 0)."""


class VersionResetFault(_Section):
    """The weight-version counter restarts at 1 mid-run (miles #2244)."""

    at_step: int = Field(default=2, ge=1, le=1_000_000)
    """The step whose weight sync restarts the learner's version counter at 1."""


class StalenessOverrunFault(_Section):
    """The experience buffer hands out groups older than the policy's staleness bound
    (AReaL #1388): from from_step on it trains on the groups of ``lag`` steps earlier."""

    from_step: int = Field(default=2, ge=1, le=1_000_000)
    """First step trained on stale groups."""
    lag: int = Field(default=2, ge=1, le=64)
    """How many steps old the admitted groups are (staleness = lag in the sync loop)."""


class SyncHangFault(_Section):
    """A weight sync blocks for a long time (verl #3873)."""

    at_step: int = Field(default=2, ge=0, le=1_000_000)
    """The step whose weight sync hangs."""
    seconds: float = Field(default=30.0, gt=0.0, le=86_400.0)
    """How long that sync blocks before it proceeds."""


class StragglerFault(_Section):
    """A few generations take much longer than the rest, so every rollout batch (which
    returns with its slowest generation) waits for them."""

    from_step: int = Field(default=1, ge=0, le=1_000_000)
    """First step with stragglers."""
    seconds: float = Field(default=20.0, gt=0.0, le=3600.0)
    """How much later than the rest of its batch the slowest generation finishes."""


class SlowRewardFault(_Section):
    """The reward stage is slowed (an overloaded verifier or sandbox)."""

    from_step: int = Field(default=1, ge=0, le=1_000_000)
    """First step with a slow reward stage."""
    seconds: float = Field(default=2.0, gt=0.0, le=3600.0)
    """Extra seconds each reward batch takes."""


class ImportanceCollapseFault(_Section):
    """The rollout reports behaviour logprobs ``nats`` too high on a share of each
    completion's tokens (a backend whose logprobs are of another, sharper distribution
    there), so the importance weights pi_learner / pi_behaviour of those tokens collapse
    toward 0 and a few tokens carry the batch (NeMo-RL #2269: a batch silently
    down-weighted 17x). Sampling itself is unchanged."""

    from_step: int = Field(default=1, ge=1, le=1_000_000)
    """First step whose rollout reports the inflated logprobs (>= 1: the start-up
    preflight compares the first step's logprobs with the learner's)."""
    nats: float = Field(default=5.0, gt=0.0, le=50.0)
    """How much higher the reported logprob of an affected token is."""
    share: float = Field(default=0.9, gt=0.0, le=1.0)
    """Chance of each token to be affected (drawn from the generate call's seed)."""


class EntropyCollapseFault(_Section):
    """The policy collapses onto its most likely tokens: after the update of ``at_step``
    the learner's output-head weights are multiplied by ``factor`` (logits scaled, the
    sampling distribution near greedy), so every completion of a group comes out alike."""

    at_step: int = Field(default=2, ge=0, le=1_000_000)
    """The step whose update sharpens the policy (its rollouts from the next step on)."""
    factor: float = Field(default=20.0, gt=1.0, le=1000.0)
    """How many times sharper the logits become."""


class NoStopFault(_Section):
    """Generation no longer stops at EOS or a stop token (a chat template whose end of
    turn the engine does not know; marin #8955): every completion runs on to
    rollout.max_new_tokens."""

    from_step: int = Field(default=1, ge=0, le=1_000_000)
    """First step whose completions never stop."""


class SkipOnResumeFault(_Section):
    """A resumed run loses its place in the data (NeMo-RL #3599, OpenRLHF #1322): its
    prompts start ``prompts`` past the checkpoint's data position, which are never
    served. The data ledger, restored from the checkpoint, shows the gap."""

    prompts: int = Field(default=4, ge=1, le=1_000_000)
    """How many prompts the resumed run skips."""


class KillRolloutWorkerFault(_Section):
    """A rollout worker's process is SIGKILLed while it holds a step's prompts (an OOM
    kill, a lost node; OpenRLHF #331): the run replaces the worker (placement.
    max_worker_replacements). Ray placements only; the worker that replaces it is spared."""

    at_step: int = Field(default=1, ge=1, le=1_000_000)
    """The step whose generation call kills every rollout worker that takes one."""


class SlowEnvFault(_Section):
    """Every environment call (reset, step) of a multi-turn task takes ``seconds`` longer
    from ``from_step`` on (a tool server that hangs; past task.env.step_timeout_s each call
    times out)."""

    from_step: int = Field(default=2, ge=0, le=1_000_000)
    """First step whose environment calls are slowed."""
    seconds: float = Field(default=30.0, gt=0.0, le=86_400.0)
    """Added to each environment call."""


class EnvErrorFault(_Section):
    """Every environment call (reset, step) of a multi-turn task raises from ``from_step``
    on (a tool that crashes)."""

    from_step: int = Field(default=2, ge=0, le=1_000_000)
    """First step whose environment calls raise."""


class FaultsConfig(_Section):
    """Fault injection, to rehearse the failure modes the alerts must name. Every fault is
    off (None) unless its table is present; each makes the real loop misbehave."""

    skip_weight_sync: SkipWeightSyncFault | None = None
    """Weight syncs that silently do not apply."""
    sleep_drops_weights: SleepDropsWeightsFault | None = None
    """The rollout wakes with an older version's weights."""
    unscaled_logprobs: UnscaledLogprobsFault | None = None
    """Behaviour logprobs without temperature scaling."""
    version_reset: VersionResetFault | None = None
    """The weight-version counter restarts at 1."""
    staleness_overrun: StalenessOverrunFault | None = None
    """The buffer admits samples older than the staleness bound."""
    sync_hang: SyncHangFault | None = None
    """One weight sync blocks for a long time."""
    straggler: StragglerFault | None = None
    """Long-tail generations hold up every rollout batch."""
    slow_reward: SlowRewardFault | None = None
    """A slowed reward stage."""
    importance_collapse: ImportanceCollapseFault | None = None
    """Behaviour logprobs too high on most tokens: the importance weights collapse."""
    entropy_collapse: EntropyCollapseFault | None = None
    """The policy's distribution collapses onto its most likely tokens."""
    no_stop: NoStopFault | None = None
    """Completions never stop before max_new_tokens."""
    skip_on_resume: SkipOnResumeFault | None = None
    """A resumed run skips prompts of its data."""
    kill_rollout_worker: KillRolloutWorkerFault | None = None
    """A rollout worker's process dies mid-run."""
    slow_env: SlowEnvFault | None = None
    """A multi-turn task's environment calls hang (task.type = "env")."""
    env_error: EnvErrorFault | None = None
    """A multi-turn task's environment calls raise (task.type = "env")."""
