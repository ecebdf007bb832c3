"""The control plane's alert rules attached to a real engine run, without the database.

    watch = AlertWatch(thresholds)
    run_local(cfg, out, sink=watch)          # each event -> rules.evaluate
    watch.first("WeightSyncDesync")          # (step, finding) of its first firing

Every event goes through the same RunHistory.add + rules.evaluate that ingest uses.
``poll`` evaluates from another thread while the run is in progress, as the periodic
task does for rules that fire when nothing happens.

``deferred=True`` keeps the events and evaluates them when the run's sink closes, in
order, at each event's own timestamp: the same findings, but the rules' cost stays out of
the run. Evaluated inline, it runs in the driver between the workers' spans (ingest runs
it in the control plane): on a Ray placement that idles every device, so a run measured
for its bubble must defer (a BubbleHigh that fires makes each evaluation fit the planner,
and the idle it adds fed the bubble it reported: step time 0.16-0.3 s -> 0.5-0.8 s).
"""

from __future__ import annotations

import copy
import threading
import time

from engine.api import Event, MetricsEvent
from jobs.alerts.history import Finding, RunFacts, RunHistory, Thresholds
from jobs.alerts.rules import evaluate


class AlertWatch:
    def __init__(self, facts: RunFacts, thresholds: Thresholds | None = None,
                 deferred: bool = False):
        self.facts, self.thresholds = facts, thresholds or Thresholds()
        self.pending: list[Event] | None = [] if deferred else None
        self.history = RunHistory()
        self.lock = threading.Lock()
        self.fired: list[tuple[int, Finding]] = []   # (the finding's step, finding)
        self.steps_checked = 0
        self.events: list[Event] = []                  # what was observed, in order

    def emit(self, event: Event) -> None:
        if self.pending is not None:
            self.pending.append(event)
            return
        self._observe(event)

    def _observe(self, event: Event) -> None:
        self.events.append(event)
        with self.lock:
            # Just before an event arrives, nothing has happened for longest: what the
            # periodic task would see at its worst moment.
            self._evaluate(event.ts)
            self.history.add(event.to_dict())
            if isinstance(event, MetricsEvent) and "reward/mean" in event.values:
                self.steps_checked += 1
                self._evaluate(event.ts)                  # what ingest sees

    def _evaluate(self, now: float) -> None:
        last = self.history.steps[-1] if self.history.steps else -1
        for f in evaluate(self.history, self.facts, self.thresholds, now):
            self.fired.append((last if f.step is None else f.step, f))

    def close(self) -> None:
        pending, self.pending = self.pending or [], None
        for event in pending:
            self._observe(event)

    def replay(self, thresholds: Thresholds) -> AlertWatch:
        """The same events through the rules again, under other thresholds: a healthy run
        judged with thresholds too tight shows that it was long enough for a rule to fire."""
        again = AlertWatch(self.facts, thresholds)
        for event in self.events:
            again._observe(event)
        return again

    def poll(self) -> list[Finding]:
        """Evaluate now, on a snapshot of what has arrived (the periodic task's view)."""
        with self.lock:
            history = copy.deepcopy(self.history)
        found = evaluate(history, self.facts, self.thresholds, time.time())
        step = history.steps[-1] if history.steps else -1
        self.fired += [(step, f) for f in found]
        return found

    def first(self, kind: str) -> tuple[int, Finding] | None:
        return next(((s, f) for s, f in self.fired if f.kind == kind), None)

    def kinds(self) -> set[str]:
        return {f.kind for _, f in self.fired}


# Judging a healthy run (tests/engine/test_no_false_alarms.py and the preset runs it shares
# with the learning tests). Thresholds no healthy run passes: StuckReward on any 20-step
# window, BubbleHigh on any two steps whose devices were ever idle, EntropyCollapse on any
# entropy once the early steps are past (every entropy is under 100 nats/token, and no
# reward gains 1000).
TOO_TIGHT = Thresholds(stuck_slope=1.0, stuck_std=10.0, stuck_zero_std_frac=0.0,
                       bubble_max=1e-6, entropy_floor=100.0, entropy_factor=1.0,
                       entropy_reward_gain=1000.0)


def assert_quiet(watch: AlertWatch, name: str, steps: int, capsys,
                 expected: frozenset[str] = frozenset()) -> None:
    """No alert in ``steps`` healthy steps but the ``expected`` kinds, in a run long enough
    for the rule with the longest window to have fired (assert_long_enough_to_fire)."""
    assert watch.steps_checked == steps
    fired = [(s, f) for s, f in watch.fired if f.kind not in expected]
    assert fired == [], [f"step {s}: {f.kind}: {f.cause}" for s, f in fired]
    assert_long_enough_to_fire(watch)
    seen = sorted({f.kind for _, f in watch.fired})
    with capsys.disabled():
        print(f"\n{name}: {watch.steps_checked} healthy steps checked, "
              + (f"only the expected {', '.join(seen)}" if seen else "no alert"))


def assert_long_enough_to_fire(watch: AlertWatch) -> None:
    """The same run under TOO_TIGHT raises the rule with the longest window: what a
    no-false-alarm test shows is that the defaults stay quiet where a rule could have fired."""
    tight = watch.replay(TOO_TIGHT).kinds()
    assert {"StuckReward", "BubbleHigh", "EntropyCollapse"} <= tight, tight
