"""The run page's health strip: one line per rule family, so an operator sees what the
rules checked, not only what fired.

    lines = strip(run.rules_checked, [(alert.kind, alert.state), ...])   # live alerts
    [Line(family="systems", colour="green", step=41, checked=("StuckReward", ...),
          unchecked=("ResyncSlow",), firing=(), acknowledged=()), ...]

A line's colour is what its alerts say; what was checked is its text:
    red     an open alert of the family
    amber   an acknowledged one, still holding (someone is on it)
    green   its rules checked through ``step`` and none holds
    grey    none of its rules checked anything yet (no inputs, no steps, or no rule)
Every family of FAMILIES has a line even with no rule (data, until its rule lands); a
rule kind this map does not know yet gets an "other" line, so a new rule shows up
before anyone files it. Pure: the rows come from the caller (jobs.alerts.views).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from jobs.alerts.rules import KINDS

FAMILIES = ("systems", "outputs", "data", "throughput")
OTHER = "other"
# The families of issue 31: the loop's systems faults; what the policy writes
# (jobs/alerts/outputs.py); what the trainer consumes; how fast it runs.
FAMILY = {
    **{kind: "systems" for kind in (
        "WeightSyncDesync", "StuckReward", "TemperatureLogprobs", "LogprobGapHigh",
        "LogprobGapDrift", "StalenessOverBound", "VersionRegression", "PhaseHang",
        "StoppedReporting", "BubbleHigh", "ResyncSlow", "RunLost", "DriverRestarted",
        "RewardErrors", "RewardOverOptimization", "EnvErrors", "EnvHang")},
    **{kind: "outputs" for kind in (
        "ImportanceWeightCollapse", "EntropyCollapse", "LengthBlowup", "NonTermination")},
    "DataIntegrity": "data",
    "ThroughputRegression": "throughput",
}
WHAT = {"systems": "sync, staleness, hangs, bubble, reward pipeline",
        "outputs": "importance weights, entropy, length, termination",
        "data": "prompts served, trained, dropped; resume gaps and repeats",
        "throughput": "samples/s and phase times against the baseline",
        OTHER: "rules not yet in a family"}


def family_of(kind: str) -> str:
    return FAMILY.get(kind, OTHER)


@dataclass(frozen=True)
class Line:
    family: str
    colour: str                      # red | amber | green | grey
    step: int | None                 # the last step one of its rules was checked through
    checked: tuple[str, ...]         # rule kinds the last evaluation fed
    unchecked: tuple[str, ...]       # its other rules: their inputs have not come
    firing: tuple[str, ...]          # kinds with an open alert
    acknowledged: tuple[str, ...]    # kinds with an acknowledged one (and no open one)

    @property
    def total(self) -> int:
        return len(self.checked) + len(self.unchecked)

    @property
    def what(self) -> str:
        return WHAT.get(self.family, "")


def colour_of(checked, firing, acknowledged) -> str:
    if firing:
        return "red"
    if acknowledged:
        return "amber"
    return "green" if checked else "grey"


def strip(rules_checked: dict[str, int | None], alerts: Iterable[tuple[str, str]],
          kinds: Iterable[str] = KINDS) -> list[Line]:
    """One Line per family (FAMILIES, then "other" when a kind falls there), from the
    last evaluation's {kind: step} and the run's live alerts as (kind, state)."""
    alerts = list(alerts)
    members: dict[str, list[str]] = {family: [] for family in FAMILIES}
    for kind in [*kinds, *rules_checked, *(k for k, _ in alerts)]:
        family = members.setdefault(family_of(kind), [])
        if kind not in family:
            family.append(kind)
    lines = []
    for family, rules in members.items():
        checked = tuple(k for k in rules if k in rules_checked)
        steps = [rules_checked[k] for k in checked if rules_checked[k] is not None]
        firing = tuple(k for k in rules if (k, "open") in alerts)
        acked = tuple(k for k in rules if (k, "acknowledged") in alerts and k not in firing)
        lines.append(Line(family, colour_of(checked, firing, acked),
                          max(steps, default=None), checked,
                          tuple(k for k in rules if k not in rules_checked), firing, acked))
    return lines
