"""Phase spans and the step metrics computed from them.

A span says "this logical device was busy with this phase from start to end". Over a
step's window [t0, t1] on D devices:

    wall           = t1 - t0
    busy(d)        = length of the union of d's spans, clipped to the window
    bubble         = 1 - sum_d busy(d) / (D * wall)
    rollout_share  = length of the union of rollout spans / wall
    time/<phase>_s = length of the union of that phase's spans (any device)
    time/idle_s    = mean over devices of (wall - busy(d))
    device/utilization/<d> = busy(d) / wall
    device/utilization/<d>/<phase> = length of the union of d's <phase> spans / wall

"waiting" spans (an actor blocked on another: the learner on experience, a worker on
the staleness bound) are reported as time/waiting_s and never count as busy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from engine import metrics as M

PHASES = M.PHASES   # busy
WAITING = M.WAITING


@dataclass(frozen=True)
class Span:
    device: str
    phase: str
    start: float
    end: float
    step: int = 0
    version: int = 0


def union_length(intervals: Iterable[tuple[float, float]], t0: float, t1: float) -> float:
    clipped = sorted((max(a, t0), min(b, t1)) for a, b in intervals if b > t0 and a < t1)
    total, cur_a, cur_b = 0.0, None, None
    for a, b in clipped:
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_b is not None:
        total += cur_b - cur_a
    return total


def phase_metrics(spans: list[Span], devices: list[str], t0: float, t1: float) -> dict[str, float]:
    wall = t1 - t0
    if wall <= 0 or not devices:
        raise ValueError("a step window needs t1 > t0 and at least one device")
    out: dict[str, float] = {M.TIME_STEP_S: wall}
    busy_total, idle = 0.0, 0.0
    busy_spans = [s for s in spans if s.phase != WAITING]
    for d in devices:
        mine = [s for s in busy_spans if s.device == d]
        busy = union_length(((s.start, s.end) for s in mine), t0, t1)
        busy_total += busy
        idle += wall - busy
        out[M.DEVICE_UTILIZATION.of(device=d)] = busy / wall
        for phase in PHASES:
            out[M.DEVICE_PHASE_UTILIZATION.of(device=d, phase=phase)] = union_length(
                ((s.start, s.end) for s in mine if s.phase == phase), t0, t1) / wall
    for phase in (*PHASES, WAITING):
        out[M.PHASE_TIME.of(phase=phase)] = union_length(
            ((s.start, s.end) for s in spans if s.phase == phase), t0, t1)
    out[M.TIME_IDLE_S] = idle / len(devices)
    out[M.BUBBLE] = 1.0 - busy_total / (len(devices) * wall)
    out[M.ROLLOUT_SHARE] = out[M.TIME_ROLLOUT_S] / wall
    return out
