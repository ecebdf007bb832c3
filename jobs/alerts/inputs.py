"""What each alert rule reads, declared on the rule, so a run that lacks it is told which
rules are not evaluated instead of passing silently (jobs/alerts/coverage.py):

    @reads(metrics=(M.REWARD_MEAN,), any_of=(M.SAMPLES_ZERO_STD_GROUP_FRAC, M.REWARD_STD))
    def stuck_reward(h, f, t, now): ...

    missing(stuck_reward.needs, h, f)  -> Missing(metrics=["reward/std or ..."], ...)

A rule's inputs are of four kinds: metric series (canonical names, engine.metrics), the
engine's typed events (weight_sync.report, span), the run's status (always known), and
facts about the run that only an rlplane RunConfig or an external run's own parameters
can give (the staleness bound, the sampling temperature): RunFacts fields that are None
while unknown. rlplane's own engine reports every one of them, so on a native run a rule
simply finds nothing yet; on an external run a rule with a missing input is skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from jobs.alerts.history import RunFacts, RunHistory

# The engine's typed events a rule can read, and what each carries (for the page).
EVENTS = {
    "weight_sync.report": "each sync's weight version and fingerprint on both sides",
    "span": "phase start and end times per device, e.g. rlplane.track's run.span",
}
# RunFacts fields a rule may need, and where an external run's parameters give them.
FACTS = {
    "staleness_bound": "a max_staleness, max_async_level or staleness_bound parameter",
    "temperature": "a temperature parameter",
    "max_new_tokens": "a max_new_tokens, max_completion_length or max_tokens parameter",
}


@dataclass(frozen=True)
class Needs:
    """A rule's inputs: every one of ``metrics``, at least one of ``any_of`` (when given),
    every event type of ``events`` and every RunFacts field of ``facts``."""
    metrics: tuple[str, ...] = ()
    any_of: tuple[str, ...] = ()
    events: tuple[str, ...] = ()
    facts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        unknown = (set(self.events) - set(EVENTS)) | (set(self.facts) - set(FACTS))
        if unknown:
            raise ValueError(f"unknown rule inputs {sorted(unknown)}")


@dataclass(frozen=True)
class Missing:
    """What a run lacks of a rule's Needs: canonical metric names (``any_of`` as one
    group: any of them would do), event types, fact names."""
    metrics: tuple[str, ...] = ()
    any_of: tuple[str, ...] = ()
    events: tuple[str, ...] = ()
    facts: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.metrics or self.any_of or self.events or self.facts)


def reads(metrics: tuple[str, ...] = (), any_of: tuple[str, ...] = (),
          events: tuple[str, ...] = (), facts: tuple[str, ...] = ()) -> Callable:
    """Declare what the decorated rule reads (kept as its ``needs``)."""
    needs = Needs(metrics, any_of, events, facts)

    def mark(rule: Callable) -> Callable:
        rule.needs = needs
        return rule
    return mark


def missing(needs: Needs, h: RunHistory, f: RunFacts) -> Missing:
    """What of ``needs`` the run has not reported (a metric with no point yet counts as
    missing) or its facts do not say."""
    reported = {"weight_sync.report": bool(h.syncs), "span": bool(h.spans)}
    return Missing(
        metrics=tuple(n for n in needs.metrics if not h.metrics.get(n)),
        any_of=() if any(h.metrics.get(n) for n in needs.any_of) else needs.any_of,
        events=tuple(e for e in needs.events if not reported[e]),
        facts=tuple(x for x in needs.facts if getattr(f, x) is None))
