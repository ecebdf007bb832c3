"""How much a run's actors slow one another when they compute at once: the co-run probe.

On Ray each rollout worker and the learner are processes of their own, and on CPU devices
of one host they share its cores' caches, memory bandwidth and clock. The planner lays the
phases of an overlapping policy side by side at the durations a sync run measured them in
sequence; on a 2-core box the overlapped phases of the long-tail recipe ran 5-15 % longer
than the same phases in sequence with the box to themselves, and 19-57 % longer with
another job's work on it (bench/async_policies.py, bench/planner_accuracy.py,
2026-12-04): the planner's over-prediction on every overlapping policy there. The probe
measures it once per run:

    alone:     the learner's workload, then worker 0's, each with the others idle
    together:  every actor's workload at once
    slowdown = rate alone / rate together     (1: no interference; per kind of actor)

Each actor runs a stand-in for its own phase on its own torch threads, over weights the
size of the policy's (capped): a rollout worker decodes (its calls' rows through every
weight: one decode step), the learner trains (512 rows: a minibatch's matmuls). Actors
computing on a CUDA device do not share a host's cores that way and report no probe.
About 3 x 3 x ``seconds`` of wall time at the start of a run (telemetry.corun_probe_s).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

WIDTH = 256                       # the stand-in layers are WIDTH x WIDTH fp32 (256 KiB)
MAX_BYTES = 256 << 20             # the stand-in's weights at most (a big policy's: capped)
LEARNER_ROWS = 512


def probe_rate(rows: int, weight_bytes: int, seconds: float) -> float | None:
    """Passes per second of ``rows`` rows through the stand-in's weights on this thread's
    torch threads for about ``seconds``; None on a CUDA device (it does not share the
    host's cores that way)."""
    if torch.cuda.is_available():         # the actor computes on its GPU
        return None
    layer = WIDTH * WIDTH * 4
    n = max(4, min(int(weight_bytes), MAX_BYTES) // layer)
    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(WIDTH, WIDTH, generator=gen) / WIDTH ** 0.5 for _ in range(n)]
    x0 = torch.randn(max(1, rows), WIDTH, generator=gen)
    passes, start = 0, time.perf_counter()
    while True:
        x = x0
        for w in weights:
            x = torch.tanh(x @ w)
        passes += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return passes / elapsed


def slowdowns(alone: dict[str, float | None], together: dict[str, float | None]
              ) -> dict[str, float]:
    """{kind: rate alone / rate together} for the kinds both measured."""
    return {k: alone[k] / together[k] for k in alone
            if alone[k] and together.get(k)}


def weight_bytes(model_dir: Path) -> int:
    """The bytes of a model directory's weight files (what the stand-in is sized to)."""
    return sum(p.stat().st_size for pattern in ("*.safetensors", "*.bin")
               for p in Path(model_dir).glob(pattern))
