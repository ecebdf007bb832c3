"""The driver's telemetry handle: numbers events, times phases, keeps the step's spans.

    with tel.phase("rollout", devices, step, version):
        ...                                # one SpanEvent per device when it ends
    metrics = tel.step_metrics(t0, t1)     # phase_metrics over the spans in the window
"""

from __future__ import annotations

import time
from contextlib import contextmanager

from engine.api import Event, EventSink, LogEvent, SpanEvent
from engine.telemetry.spans import Span, phase_metrics


class Telemetry:
    def __init__(self, sink: EventSink, devices: list[str], clock=time.time):
        self.sink = sink
        self.devices = devices
        self.clock = clock
        self.seq = 0
        self.spans: list[Span] = []

    def emit(self, event: Event) -> Event:
        self.seq += 1
        event.seq, event.ts = self.seq, self.clock()
        self.sink.emit(event)
        return event

    def log(self, message: str, level: str = "info") -> None:
        self.emit(LogEvent(level=level, message=message))

    @contextmanager
    def phase(self, phase: str, devices: list[str], step: int, version: int):
        start = self.clock()
        try:
            yield
        finally:
            end = self.clock()
            for d in devices:
                self.spans.append(Span(d, phase, start, end, step, version))
                self.emit(SpanEvent(device=d, phase=phase, start=start, end=end,
                                    step=step, version=version))

    def step_metrics(self, t0: float, t1: float) -> dict[str, float]:
        window = [s for s in self.spans if s.end > t0 and s.start < t1]
        self.spans = [s for s in self.spans if s.end > t1]   # keep what spills over
        return phase_metrics(window, self.devices, t0, t1)
