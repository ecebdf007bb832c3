"""Which alert rules a run's history lets rlplane evaluate, and, for each of the others,
what it lacks and what the run's framework would have to log to feed it:

    evaluated, not_evaluated = coverage(history, facts)
    evaluated      ["StuckReward", "RunLost", ...]                 (rule kinds, RULES order)
    not_evaluated  [NotEvaluated("LogprobGapHigh", metrics=("logprob_gap/mean",),
                                 to_log={"logprob_gap/mean":
                                         ["sampling/sampling_logp_difference/mean"]}), ...]

The same declarations (``rule.needs``) decide what rules.evaluate skips on an external run,
so the page never lists a rule as evaluated that was skipped, or the other way round. On a
native run the engine reports every input, so the pages do not show coverage there.

    checked(history, facts) -> {"StuckReward": 41, "RunLost": 41, ...}
    the rules the history feeds, each with the step its inputs reach: what an evaluation
    over this history checked (lifecycle stores it on the run for the health strip).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.api import their_names
from jobs.alerts.history import RunFacts, RunHistory
from jobs.alerts.inputs import EVENTS, FACTS, missing
from jobs.alerts.rules import RULES

# What no framework's adapter reports (a script could send it through the same door):
# the pages list the rules that read it apart, in one line.
ENGINE_ONLY = "weight_sync.report"


@dataclass(frozen=True)
class NotEvaluated:
    """A rule the run's history cannot feed: the canonical metrics it lacks (all of
    ``metrics``, any one of ``any_of``), the framework's own names for each (where it has
    none: the canonical name itself, or nothing, and it is logged under the canonical
    name), and the other inputs it lacks, in words (an event type, a fact about the run)."""
    kind: str
    metrics: tuple[str, ...] = ()
    any_of: tuple[str, ...] = ()
    to_log: dict[str, list[str]] = field(default_factory=dict)
    other: tuple[str, ...] = ()
    engine_only: bool = False    # reads what only rlplane's engine reports today


def coverage(h: RunHistory, f: RunFacts) -> tuple[list[str], list[NotEvaluated]]:
    """The rules the history feeds, and what each of the others lacks."""
    evaluated, gaps = [], []
    for kind, rule in RULES.items():
        lack = missing(rule.needs, h, f)
        if not lack:
            evaluated.append(kind)
            continue
        names = lack.metrics + lack.any_of
        gaps.append(NotEvaluated(
            kind, lack.metrics, lack.any_of,
            to_log={name: their_names(f.framework, name) for name in names},
            other=tuple(f"{e} events ({EVENTS[e]})" for e in lack.events)
            + tuple(f"the run's {x.replace('_', ' ')} ({FACTS[x]})" for x in lack.facts),
            engine_only=ENGINE_ONLY in lack.events))
    return evaluated, gaps


def checked(h: RunHistory, f: RunFacts) -> dict[str, int | None]:
    """{kind: the last step every metric the rule reads reached} for each rule the
    history feeds (``coverage``'s evaluated, on native runs too: a rule whose inputs have
    not come yet checked nothing). A rule that reads no metric: the history's last step
    (None before the first)."""
    last_any = max((max(series) for series in h.metrics.values() if series), default=None)

    def last(name: str) -> int | None:
        series = h.metrics.get(name)
        return max(series) if series else None

    out: dict[str, int | None] = {}
    for kind, rule in RULES.items():
        if missing(rule.needs, h, f):
            continue
        reach = [last(n) for n in rule.needs.metrics]
        if rule.needs.any_of:
            reach.append(max(s for n in rule.needs.any_of if (s := last(n)) is not None))
        out[kind] = min(reach) if reach else last_any
    return out
