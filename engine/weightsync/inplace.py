"""In-place weight sync for the single-process (colocated) loop.

The rollout engine keeps its own tensors; the sync copies the learner's tensors into them
(``copy_``, no reallocation) and the engine then fingerprints what it actually serves.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from engine.rollout.base import RolloutEngine
from engine.weightsync.base import SyncResult


class InPlaceTransport:
    name = "in_place"

    def __init__(self, engine: RolloutEngine):
        self.engine = engine

    def push(self, named_tensors: Sequence[tuple[str, torch.Tensor]], version: int,
             learner_fingerprint: str, version_ready_at: float) -> SyncResult:
        report = self.engine.load_weights(named_tensors, version)
        done = time.time()
        return SyncResult(
            transport=self.name, version_learner=version,
            version_rollout=self.engine.weight_version(),
            fingerprint_learner=learner_fingerprint,
            fingerprint_rollout=report.fingerprint,
            bytes=report.bytes, latency_s=done - version_ready_at)
