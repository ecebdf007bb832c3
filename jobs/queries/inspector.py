"""The rollout inspector's query: one step's sampled rollouts, by group, filtered.

    step_view(run, step, SampleFilters(reward_min=0.5, truncated=False))
      -> {"step", "steps", "groups": [{"group", "prompt", "samples": [{..., "match"}]}],
          "samples", "matching"}

A filter picks rollouts; a group with at least one pick is shown whole (GRPO's advantage of
a rollout means something only next to the rest of its group), its picks marked "match".
"largest gap" orders the groups by their largest token logprob gap, largest first.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.models import InspectedSample, Run

ORDERS = ("group", "gap")


@dataclass(frozen=True)
class SampleFilters:
    reward_min: float | None = None
    reward_max: float | None = None
    truncated: bool | None = None      # None: either
    mixed_versions: bool = False       # only rollouts a partial rollout continued
    gap_min: float | None = None       # only rollouts with a token gap at least this
    order: str = "group"               # "gap": the group with the largest gap first

    def picks(self, s: InspectedSample) -> bool:
        return ((self.reward_min is None or s.reward >= self.reward_min)
                and (self.reward_max is None or s.reward <= self.reward_max)
                and (self.truncated is None or s.truncated == self.truncated)
                and (not self.mixed_versions or s.mixes_versions)
                and (self.gap_min is None or (s.max_gap or 0.0) >= self.gap_min))


def sampled_steps(run: Run) -> list[int]:
    return list(InspectedSample.objects.filter(run=run).order_by("step")
                .values_list("step", flat=True).distinct())


def step_view(run: Run, step: int | None, filters: SampleFilters) -> dict:
    """The inspector's data for ``step`` (None: the latest sampled step)."""
    steps = sampled_steps(run)
    if step is None and steps:
        step = steps[-1]
    rows = list(InspectedSample.objects.filter(run=run, step=step).order_by("index"))
    groups: dict[int, dict] = {}
    for s in rows:
        g = groups.setdefault(s.group, {"group": s.group, "prompt": s.prompt, "samples": [],
                                        "max_gap": None, "matching": 0})
        g["samples"].append({**s.as_dict(), "match": filters.picks(s)})
        g["matching"] += filters.picks(s)
        if s.max_gap is not None:
            g["max_gap"] = max(g["max_gap"] or 0.0, s.max_gap)
    shown = [g for g in groups.values() if g["matching"]]
    if filters.order == "gap":
        shown.sort(key=lambda g: -(g["max_gap"] or 0.0))
    return {"run_id": run.pk, "step": step, "steps": steps, "groups": shown,
            "samples": len(rows), "matching": sum(g["matching"] for g in shown)}
