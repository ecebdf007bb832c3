"""The what-if table: each placement x async policy x device split, from one fit.

    rows = plan(fit, devices=8)         # Prediction per (placement, policy)
    print(format_table(rows, fit))

Placements tried on ``devices``: colocated on Ray over all of them, and disaggregated
with 1/4, 1/2 and 3/4 of them generating (one device per rollout worker, the rest the
learner's). Policies: sync, one-step-off, fully async (eta 2, wait), partial rollout
(over-provision 1.5, eta 1) -- the run's own settings where it used that policy.
"""

from __future__ import annotations

from engine.config import (
    AsyncPolicyConfig,
    FullyAsyncPolicyConfig,
    OneStepOffPolicyConfig,
    PartialRolloutPolicyConfig,
    RunConfig,
    SyncPolicyConfig,
)
from engine.planner.fit import Fit
from engine.planner.model import Prediction, Shape, simulate


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


def plan(fit: Fit, devices: int | None = None, cfg: RunConfig | None = None,
         shapes: list[Shape] | None = None) -> list[Prediction]:
    """Predictions for every placement x policy; ``devices`` defaults to the run's."""
    shapes = shapes or ([fit.shape] if devices is None else []) + shapes_for(
        devices or fit.shape.devices)
    return [simulate(fit.inputs, s, p, fit.loop_overhead_s)
            for s in shapes for p in policies_for(cfg)]


def best_alternative(rows: list[Prediction], current: Prediction) -> Prediction:
    return max((r for r in rows if r is not current), key=lambda r: r.samples_per_s,
               default=current)


HEADER = ("placement", "policy", "samples/s", "x run", "step s", "bubble", "rollout share",
          "staleness mean/max", "dropped/step")


def table_rows(rows: list[Prediction], base: Prediction) -> list[tuple[str, ...]]:
    return [(r.placement, r.policy, f"{r.samples_per_s:.1f}",
             f"{r.samples_per_s / base.samples_per_s:.2f}", f"{r.step_s:.3f}",
             f"{r.bubble:.2f}", f"{r.rollout_share:.2f}",
             f"{r.staleness_mean:.2f}/{r.staleness_max}", f"{r.dropped_per_step:.2f}")
            for r in rows]


def format_table(rows: list[Prediction], base: Prediction) -> str:
    body = [HEADER, *table_rows(rows, base)]
    widths = [max(len(r[i]) for r in body) for i in range(len(HEADER))]
    return "\n".join("  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths, strict=True)))
                     for r in body)
