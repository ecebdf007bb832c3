"""Phase spans where the work runs, and the driver's telemetry handle that gathers them.

    # in an actor (or the driver's process), on that actor's devices and clock
    rec = SpanRecorder(["gpu:0"])
    with rec.phase("rollout", step, version):
        ...
    rec.record("env", start, end, step, version)   # timed elsewhere (a thread's call)
    closed, running = rec.drain()          # spans ended since the last drain; the ones
                                           # still running, cut at now
    # in the driver
    tel.ingest(closed, running)            # closed -> SpanEvents; running -> metrics only
    metrics = tel.step_metrics(t0, t1)     # phase_metrics over the spans in the window

Running spans let a step's metrics count a generation that started before the step ends
and finishes after (the overlapped policies); its closed span, drained later, fills the
rest of it into the next step's window. Actors on the same host share the wall clock.
"""

from __future__ import annotations

import itertools
import threading
import time
from contextlib import contextmanager

from engine.events import Event, EventSink, LogEvent, SpanEvent
from engine.telemetry.spans import Span, phase_metrics


class SpanRecorder:
    def __init__(self, devices: list[str], clock=time.time):
        self.devices, self.clock = devices, clock
        self._closed: list[Span] = []
        self._running: dict[int, tuple[str, float, int, int]] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()     # drain() runs on its own thread in an actor

    @contextmanager
    def phase(self, phase: str, step: int, version: int):
        key, start = next(self._ids), self.clock()
        with self._lock:
            self._running[key] = (phase, start, step, version)
        try:
            yield
        finally:
            end = self.clock()
            with self._lock:
                del self._running[key]
                self._closed += [Span(d, phase, start, end, step, version)
                                 for d in self.devices]

    def record(self, phase: str, start: float, end: float, step: int, version: int) -> None:
        """A span timed elsewhere (an environment call on a thread of its own)."""
        with self._lock:
            self._closed += [Span(d, phase, start, end, step, version) for d in self.devices]

    def drain(self) -> tuple[list[Span], list[Span]]:
        now = self.clock()
        with self._lock:
            closed, self._closed = self._closed, []
            running = [Span(d, phase, start, now, step, version)
                       for phase, start, step, version in self._running.values()
                       for d in self.devices]
        return closed, running


class Telemetry:
    def __init__(self, sink: EventSink, devices: list[str], clock=time.time):
        self.sink = sink
        self.devices = devices
        self.clock = clock
        self.seq = 0
        self.spans: list[Span] = []
        self._running: list[Span] = []

    def emit(self, event: Event) -> Event:
        self.seq += 1
        event.seq, event.ts = self.seq, self.clock()
        self.sink.emit(event)
        return event

    def log(self, message: str, level: str = "info") -> None:
        self.emit(LogEvent(level=level, message=message))

    @contextmanager
    def phase(self, phase: str, devices: list[str], step: int, version: int):
        """A phase the driver times itself, on ``devices``."""
        start = self.clock()
        try:
            yield
        finally:
            self.ingest([Span(d, phase, start, self.clock(), step, version) for d in devices])

    def ingest(self, closed: list[Span], running: list[Span] | None = None) -> None:
        """Spans from an actor's recorder: closed ones become SpanEvents; running ones
        only count toward the next step_metrics (they come back closed later)."""
        for s in closed:
            self.spans.append(s)
            self.emit(SpanEvent(device=s.device, phase=s.phase, start=s.start, end=s.end,
                                step=s.step, version=s.version))
        if running is not None:
            self._running += running

    def step_metrics(self, t0: float, t1: float) -> dict[str, float]:
        window = [s for s in self.spans + self._running if s.end > t0 and s.start < t1]
        self.spans = [s for s in self.spans if s.end > t1]   # keep what spills over
        self._running = []
        return phase_metrics(window, self.devices, t0, t1)
