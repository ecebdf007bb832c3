"""How an operator steers a running run between steps: a stop, and the live controls.

    StopSignal    a SIGTERM (request), a STOP file in the run directory, or the caller's
                  stop_requested() answering True: the loop checkpoints after the step in
                  progress and ends "stopped"
    LiveControls  (engine.controls) from a take() callback, asked at every step boundary:

    before step s:  take() -> checkpoint now | pause | resume | set_lr | set_eval_every |
                              set_rollout_workers (engine.orchestration.resizing)
                    each applied in order, reported as a control.applied event at step s
                    paused: hold here (asking for controls and stop every HOLD_POLL_S)
                    until a resume, or a stop (the loop then ends without step s)
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from engine.controls import (
    CheckpointControl,
    Control,
    PauseControl,
    ResumeControl,
    SetEvalEveryControl,
    SetLrControl,
    SetRolloutWorkersControl,
)
from engine.events import ControlAppliedEvent
from engine.telemetry.recorder import Telemetry

HOLD_POLL_S = 0.25  # while paused: how often the loop asks for controls and stop


class StopSignal:
    def __init__(self, stop_file: Path, hook: Callable[[], bool] | None = None):
        self.stop_file, self.hook, self.event = stop_file, hook, threading.Event()

    def request(self) -> None:
        self.event.set()

    def requested(self) -> bool:
        if self.event.is_set() or self.stop_file.exists():
            return True
        if self.hook is not None and self.hook():
            self.event.set()  # the answer is final: the end-of-run status must agree
            return True
        return False

    def wait(self, seconds: float) -> None:
        """Sleep up to ``seconds``; a request (a SIGTERM) ends it at once."""
        self.event.wait(seconds)

    @contextmanager
    def on_sigterm(self) -> Iterator[None]:
        """Inside, a SIGTERM requests the stop (only where Python may install a handler:
        the main thread); the previous handler comes back after."""
        main = threading.current_thread() is threading.main_thread()
        prev = signal.getsignal(signal.SIGTERM) if main else None
        if prev is not None:
            signal.signal(signal.SIGTERM, lambda *_: self.request())
        try:
            yield
        finally:
            if prev is not None:
                signal.signal(signal.SIGTERM, prev)


class Steered(Protocol):
    """What the controls act on: the loop, between two steps."""

    def checkpoint(self) -> None: ...

    def set_lr(self, lr: float) -> float: ...  # returns the learning rate it replaced

    def set_rollout_workers(self, n: int) -> str: ...  # what it did (or why it refused)


class LiveControls:
    def __init__(self, take: Callable[[], list[Control]] | None, eval_every: int,
                 tel: Telemetry, stop: StopSignal):
        self.take, self.tel, self.stop = take, tel, stop
        self.eval_every = eval_every  # the held-out eval cadence, which set_eval_every sets
        self.paused = False
        self.boundary = 0             # the step the controls in hand take effect from

    def at_boundary(self, step: int, loop: Steered) -> bool:
        """Before ``step``: apply what arrived since the last boundary; paused, hold until
        a resume or a stop. False when a stop came while paused: the step must not run."""
        self.boundary = step
        self.apply_pending(loop)
        if not self.paused:
            return True
        while self.paused and not self.stop.requested():
            self.stop.wait(HOLD_POLL_S)
            self.apply_pending(loop)
        return not self.stop.requested()

    def apply_pending(self, loop: Steered) -> None:
        """Apply the live controls that arrived since the last ask, in order."""
        if self.take is None:
            return
        for control in self.take():
            self.apply(control, loop)

    def apply(self, control: Control, loop: Steered) -> None:
        """One control, at the boundary before step ``self.boundary``; reported as applied
        (with who asked) so the control plane marks it and the charts draw it."""
        step, value = self.boundary, None
        match control:
            case CheckpointControl():
                loop.checkpoint()
                message = f"checkpoint written at step {step}"
            case PauseControl():
                message = ("already paused" if self.paused
                           else f"paused before step {step}: generation and training wait")
                self.paused = True
            case ResumeControl():
                message = f"resumed at step {step}" if self.paused else "was not paused"
                self.paused = False
            case SetLrControl(value=lr):
                previous = loop.set_lr(lr)
                value = lr
                message = f"learning rate {previous:g} -> {lr:g} from step {step}"
            case SetEvalEveryControl(value=every):
                value = float(every)
                message = (f"eval every {self.eval_every} -> {every} steps from step {step}"
                           if every else "eval only before and after the run from now on")
                self.eval_every = every
            case SetRolloutWorkersControl(value=n):
                value = float(n)
                message = loop.set_rollout_workers(n)
        who = control.requested_by or "the engine"
        self.tel.emit(ControlAppliedEvent(control_id=control.id, kind=control.kind,
                                          value=value, step=step,
                                          requested_by=control.requested_by,
                                          message=f"{message} (by {who})"))
