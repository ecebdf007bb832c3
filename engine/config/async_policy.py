"""Config sections of when rollouts run relative to learner updates, and the staleness
bound each policy implies."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from engine.config._base import FieldError, _choice, _Section

# --------------------------------------------------------------------------- async policy

class SyncPolicyConfig(_Section):
    """Rollout, reward, learner, weight sync in strict sequence; staleness is always 0."""

    type: Literal["sync"] = "sync"

    @property
    def staleness_bound(self) -> int:
        """The most policy versions a trained-on sample may lag the learner (eta)."""
        return 0


class OneStepOffPolicyConfig(_Section):
    """Generation of step k+1 overlaps training of step k; staleness is at most 1."""

    type: Literal["one_step_off"] = "one_step_off"

    @property
    def staleness_bound(self) -> int:
        return 1


class PartialRolloutPolicyConfig(_Section):
    """APRIL: over-provision prompts, stop generating once the step's groups are complete,
    and continue the unfinished generations next step under the new weights; by default
    one step ahead of the learner (the next step's generation overlaps this step's
    update, as slime runs APRIL with its async trainer)."""

    type: Literal["partial_rollout"] = "partial_rollout"
    over_provision: float = Field(default=1.5, ge=1.0, le=8.0)
    """Prompts started per step as a multiple of rollout.prompts_per_step."""
    overlap: bool = True
    """true: each rollout worker starts the next step's call (its carried groups and fresh
    ones) as soon as this step's groups are taken, so generation runs during the update
    (one_step_off's schedule; a fresh group trains one version after it was generated, a
    carried one two). false: the paper's synchronous form, each step's generation after
    the previous update (staleness comes from carried groups alone)."""
    max_staleness: int = Field(default=2, ge=0, le=64)
    """Groups whose oldest tokens are more versions old than this at update time are
    dropped (and counted). With overlap, at least 2: a group generated one step ahead and
    carried once trains two versions after its first tokens."""

    @property
    def staleness_bound(self) -> int:
        return self.max_staleness

    @model_validator(mode="after")
    def _overlap_needs_room_for_its_carry(self) -> PartialRolloutPolicyConfig:
        if self.overlap and self.max_staleness < 2:
            raise FieldError(
                "async_policy.max_staleness",
                f"partial rollout with overlap = true generates one step ahead (staleness "
                f"1) and continues its carried groups a step later (2): with max_staleness "
                f"= {self.max_staleness} every carried group would be dropped. Set "
                f"async_policy.max_staleness = 2 (or more), or async_policy.overlap = false "
                f"for the synchronous form")
        return self


class FullyAsyncPolicyConfig(_Section):
    """Rollout workers generate continuously; the learner trains on what has arrived."""

    type: Literal["fully_async"] = "fully_async"
    max_staleness: int = Field(default=2, ge=0, le=64)
    """The staleness bound eta, in policy versions: no sample trains more than eta
    versions after the version that generated it."""
    on_stale: Literal["wait", "drop"] = "wait"
    """"wait": a worker starts a batch only when it cannot exceed eta; "drop": workers
    never wait, and groups older than eta are dropped at update time (and counted)."""
    prompts_per_call: int = Field(default=0, ge=0, le=4096)
    """Prompts per generate call of a worker; smaller calls stream experience sooner. 0
    means rollout.prompts_per_step split evenly across the rollout workers."""
    over_provision: float = Field(default=1.0, ge=1.0, le=8.0)
    """Interruptible generation above 1: a call starts this multiple of its prompts, stops
    once it has prompts_per_call complete groups and continues the unfinished ones in the
    worker's next call, under newer weights (they mix versions; too stale ones drop)."""

    @property
    def staleness_bound(self) -> int:
        return self.max_staleness


AsyncPolicyConfig = _choice(SyncPolicyConfig, OneStepOffPolicyConfig,
                            PartialRolloutPolicyConfig, FullyAsyncPolicyConfig)

