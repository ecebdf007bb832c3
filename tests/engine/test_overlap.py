"""Generation beside the update in one process (placement.overlap_threads): the rollout
worker on a thread of its own (engine.orchestration.actors.ThreadActor) with its own torch
threads, by default at the lowest CPU priority beside a learner that keeps every core
(placement.overlap_share); the in-place sync never copies weights mid-update."""

import threading

import pytest
import torch

from engine.api import MetricsEvent, SpanEvent, WeightSyncEvent, run_local
from engine.config import ConfigError, OneStepOffPolicyConfig, SyncPolicyConfig
from engine.orchestration.actors import ThreadActor, concurrent, wait_any
from engine.orchestration.deployment import Deployment
from engine.planner import shape_of, simulate
from engine.telemetry.sinks import MemorySink

from .conftest import small_run
from .test_planner import fixed

OVERLAPPED = {"type": "colocated", "overlap_threads": 1}


class Recorder:
    def __init__(self):
        self.calls = []

    def work(self, x):
        self.calls.append((x, threading.current_thread().name, torch.get_num_threads()))
        return x * 2

    @concurrent("telemetry")
    def peek(self):
        return threading.current_thread().name


def test_a_thread_actor_runs_calls_in_order_on_its_thread_with_its_own_torch_threads():
    before = torch.get_num_threads()
    actor = ThreadActor(Recorder(), threads=1, name="t")
    try:
        first = actor.call(Recorder.work, 1)
        second = actor.call(Recorder.work, first)          # a future as an argument
        assert second.result(10) == 4 and wait_any([first, second])
        assert [(x, n.startswith("rlplane-t"), k) for x, n, k in actor.obj.calls] == [
            (1, True, 1), (2, True, 1)]
        # a telemetry method answers on the caller's thread, beside a call in flight
        assert actor.call(Recorder.peek).result() == threading.current_thread().name
        assert torch.get_num_threads() == before            # the driver's count is its own
    finally:
        actor.kill()


def test_a_thread_actor_at_idle_priority_runs_below_the_driver():
    """placement.overlap_share = "idle": the rollout thread at nice 19 (what the update
    leaves idle), the driver's thread, and so the learner, as it was."""
    import os

    def nice() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    class Probe:
        def priority(self):
            return nice(), torch.get_num_threads()

    before = nice()
    actor = ThreadActor(Probe(), threads=1, name="idle", nice=19)
    try:
        assert actor.call(Probe.priority).result(10) == (19, 1)
        assert nice() == before
    finally:
        actor.kill()


@pytest.mark.parametrize("changes, says", [
    ({"async_policy": {"type": "sync"}}, 'use "one_step_off", "fully_async" or'),
    ({"async_policy": {"type": "partial_rollout", "overlap": False, "max_staleness": 1}},
     "partial rollout with async_policy.overlap = false waits"),
    ({"placement": {**OVERLAPPED, "ray": True}}, "placement.threads_per_actor"),
])
def test_overlap_threads_need_an_overlapping_policy_in_the_drivers_process(changes, says):
    with pytest.raises(ConfigError) as exc:
        small_run(**{"async_policy": {"type": "one_step_off"}, "placement": OVERLAPPED,
                     **changes})
    field, message = exc.value.errors[0]
    assert field == "placement.overlap_threads" and says in message


def test_in_process_one_step_off_generates_the_next_batch_during_the_update(tmp_path,
                                                                           model_cache):
    sink = MemorySink()
    cfg = small_run(steps=4, async_policy={"type": "one_step_off"}, placement=OVERLAPPED,
                    telemetry={"corun_probe_s": 0.05})
    summary = run_local(cfg, tmp_path, sink=sink)
    assert summary.status == "succeeded" and summary.steps_done == 4
    spans = sink.of_type(SpanEvent)
    assert {(s.device, s.phase) for s in spans if s.phase in ("rollout", "learner")} == {
        ("cpu:1", "rollout"), ("cpu:0", "learner")}            # a device each
    learner = [s for s in spans if s.phase == "learner"]
    rollout = [s for s in spans if s.phase == "rollout"]
    assert any(r.start < u.end and u.start < r.end for u in learner for r in rollout)
    steps = [e.values for e in sink.of_type(MetricsEvent) if "staleness/max" in e.values]
    assert [v["staleness/max"] for v in steps] == [0, 1, 1, 1]
    # the worker's thread and the learner were probed computing at once
    assert all(v["host/corun_slowdown/learner"] > 0 for v in steps)
    syncs = sink.of_type(WeightSyncEvent)
    assert [s.version_learner for s in syncs] == [0, 1, 2, 3, 4]
    assert all(s.matched for s in syncs)


class Order:
    """Fakes at the Deployment's seams that log what happens in which order."""

    def __init__(self):
        self.log = []

    def quiesce(self):
        self.log.append("sync received")

    def call(self, method, *args):
        self.log.append(method.__name__)

        class Answer:
            def result(self, timeout_s=None):
                return {}
        return Answer()


def test_an_update_beside_a_threaded_worker_waits_for_the_in_place_copy_first():
    """The in-place ticket is the learner's live tensors, copied on the worker's thread:
    the update must not start before the copy is done."""
    seam = Order()
    d = Deployment(learner=seam, workers=[], sharing=[], sync=seam, threaded=True)
    d.update([], step=3, version=3)
    assert seam.log == ["sync received", "update"]
    seam.log.clear()
    Deployment(learner=seam, workers=[], sharing=[], sync=seam).update([], 3, 3)
    assert seam.log == ["update"]                     # in the driver's thread: nothing to wait


def test_the_planner_overlaps_the_in_process_worker_like_its_own_device():
    cfg = small_run(async_policy={"type": "one_step_off"}, placement=OVERLAPPED).placement
    shape = shape_of(cfg)
    assert not shape.serial and shape.devices == 2
    sync = simulate(fixed(), shape, SyncPolicyConfig(), steps=20)
    off = simulate(fixed(), shape, OneStepOffPolicyConfig(), steps=20)
    assert off.samples_per_s > 1.2 * sync.samples_per_s
