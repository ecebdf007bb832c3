"""The what-if table: each placement x async policy x device split, from one fit.

    table = plan_table(fit, cfg, devices=8)  # Prediction per (placement, policy), the
    print(format_table(table))               # run's own, the best alternative and its gain

Placements tried on ``devices``: colocated on Ray over all of them, and disaggregated
with 1/4, 1/2 and 3/4 of them generating (one device per rollout worker, the rest the
learner's). Policies: sync, one-step-off, fully async (eta 2, wait), partial rollout
(over-provision 1.5, eta 1) -- the run's own settings where it used that policy.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine import metrics as M
from engine.config import (
    AsyncPolicyConfig,
    FullyAsyncPolicyConfig,
    OneStepOffPolicyConfig,
    PartialRolloutPolicyConfig,
    RunConfig,
    SyncPolicyConfig,
)
from engine.planner.fit import Fit
from engine.planner.model import Prediction, Shape, shape_of, simulate


def shapes_for(devices: int) -> list[Shape]:
    out = [Shape(f"colocated {devices}", devices, 1, devices, shared=True)]
    splits = sorted({max(1, min(devices - 1, round(devices * f))) for f in (0.25, 0.5, 0.75)})
    if devices >= 2:
        out += [Shape(f"disaggregated {r}+{devices - r}", r, devices - r, devices)
                for r in splits]
    return out


def policies_for(cfg: RunConfig | None) -> list[AsyncPolicyConfig]:
    own = cfg.async_policy if cfg is not None else None
    defaults = [SyncPolicyConfig(), OneStepOffPolicyConfig(), FullyAsyncPolicyConfig(),
                PartialRolloutPolicyConfig()]
    return [own if own is not None and own.type == p.type else p for p in defaults]


def plan(fit: Fit, devices: int | None = None, cfg: RunConfig | None = None) -> list[Prediction]:
    """Predictions for every placement x policy on ``devices`` (default: the run's)."""
    shapes = shapes_for(devices or fit.shape.devices)
    return [simulate(fit.inputs, s, p, fit.loop_overhead_s)
            for s in shapes for p in policies_for(cfg)]


@dataclass
class PlanTable:
    rows: list[Prediction]
    current: Prediction          # the run as it ran: its placement and policy
    best: Prediction             # the fastest row
    fitted_steps: int
    devices: int

    @property
    def gain(self) -> float:
        """The best row's samples/s over the run's own (predicted)."""
        return self.best.samples_per_s / self.current.samples_per_s

    def row_for(self, cfg: RunConfig) -> tuple[Prediction | None, str]:
        """(the row predicting ``cfg``'s placement under its policy type, "") or (None, why
        there is none): the table holds the fitted run's own layout and those it tries on
        its device count, so another device count or split has no row."""
        want = shape_of(cfg.placement)
        for r in self.rows:          # the run's own row first
            if r.policy == cfg.async_policy.type and r.shape is not None \
                    and r.shape.same_layout(want):
                return r, ""
        return None, (f"no row for {want.label} under "
                      f"{cfg.async_policy.type} (it plans {self.devices} devices)")

    def summary(self) -> str:
        b = self.best
        return (f"the planner (fitted on {self.fitted_steps} steps) predicts "
                f"{b.samples_per_s:.1f} samples/s ({self.gain:.2f}x this run's "
                f"{self.current.samples_per_s:.1f}) with {b.policy} on {b.placement}, "
                f"bubble {b.bubble:.2f}, staleness up to {b.staleness_max}")


def plan_table(fit: Fit, cfg: RunConfig, devices: int | None = None) -> PlanTable:
    current = simulate(fit.inputs, fit.shape, cfg.async_policy, fit.loop_overhead_s)
    current.placement = f"{current.placement} (this run)"
    rows = plan(fit, devices, cfg)
    best = max([current, *rows], key=lambda r: r.samples_per_s)
    for r in [current, *rows]:
        r.speedup = r.samples_per_s / current.samples_per_s
    return PlanTable([current, *rows], current, best, fit.steps,
                     devices or fit.shape.devices)


HEADER = ("placement", "policy", "samples/s", "x run", "step s", M.BUBBLE, "rollout share",
          "staleness mean/max", "dropped/step")


def _cells(rows: list[Prediction]) -> list[tuple[str, ...]]:
    return [(r.placement, r.policy, f"{r.samples_per_s:.1f}", f"{r.speedup:.2f}",
             f"{r.step_s:.3f}",
             f"{r.bubble:.2f}", f"{r.rollout_share:.2f}",
             f"{r.staleness_mean:.2f}/{r.staleness_max}", f"{r.dropped_per_step:.2f}")
            for r in rows]


def format_table(table: PlanTable) -> str:
    body = [HEADER, *_cells(table.rows)]
    widths = [max(len(r[i]) for r in body) for i in range(len(HEADER))]
    return "\n".join("  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths, strict=True)))
                     for r in body)
