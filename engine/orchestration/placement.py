"""Logical devices and which roles run on them.

    colocated, devices=2:   cpu:0 [rollout | reward | learner | sync]   (roles take turns)
                            cpu:1 [rollout | reward | learner | sync]

Spans are recorded per logical device, so bubble and utilization mean the same thing
whether a device is a CPU slot here or a GPU in a Ray placement group.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.config import ColocatedPlacementConfig


@dataclass(frozen=True)
class Layout:
    rollout: list[str]
    learner: list[str]

    @property
    def devices(self) -> list[str]:
        return list(dict.fromkeys(self.rollout + self.learner))


def layout_for(cfg: ColocatedPlacementConfig) -> Layout:
    devices = [f"cpu:{i}" for i in range(cfg.devices)]
    return Layout(rollout=devices, learner=devices)
