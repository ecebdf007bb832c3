"""Elastic rollout capacity (engine.orchestration.resizing): set_rollout_workers between
steps. One real run on Ray with logical GPUs grows by a worker, is refused a size the
cluster cannot hold, and shrinks back; the rest are the seams, with fakes.

    step        0        1        2        3
    workers     gpu:0    gpu:0    gpu:0    gpu:0
                         gpu:2    gpu:2              (gpu:1: the learner)
    controls         +1 (2)   9 refused   -1 (1)
"""

import pytest

from engine.api import (
    ControlAppliedEvent,
    ControlError,
    LogEvent,
    MetricsEvent,
    SpanEvent,
    WeightSyncEvent,
    WorkersResizedEvent,
    check_control,
    run_local,
    validate_control,
)
from engine.api import metrics as M
from engine.config import validate_config
from engine.controls import SetRolloutWorkersControl
from engine.orchestration.actors import LocalActor
from engine.orchestration.placement import (
    PlacementError,
    RolloutPlaces,
    grown_bundles,
    layout_for,
)
from engine.orchestration.resizing import Resizing
from engine.rollout.base import WeightReport
from engine.telemetry.recorder import Telemetry
from engine.telemetry.sinks import MemorySink
from engine.weightsync.base import SyncResult
from engine.weightsync.fingerprint import fingerprint
from engine.weightsync.session import EngineHost, WeightSyncSession

from .. import shared
from .conftest import small_run
from .test_delta_sync import _push, _serves, _session, _shm, _step, _weights
from .test_transports_units import _Tensors

PLAN = {1: 2, 2: 9, 3: 1}      # before step k: set_rollout_workers n


def resized_run(tmp_path):
    cfg = small_run(steps=4, placement={"type": "disaggregated"},
                    weight_sync={"type": "object_store"},
                    async_policy={"type": "one_step_off"}, rollout={"max_new_tokens": 8})
    sink = MemorySink()
    asked: set[int] = set()

    def take():
        step = max((e.step for e in sink.events if isinstance(e, MetricsEvent)
                    and M.ROLLOUT_WORKERS in e.values), default=-1) + 1
        if step in PLAN and step not in asked:
            asked.add(step)
            return [SetRolloutWorkersControl(id=step, value=PLAN[step], requested_by="olga")]
        return []

    return run_local(cfg, tmp_path, sink=sink, take_controls=take), sink.events


@pytest.mark.slow  # one 4-step run on Ray that starts a worker more
def test_a_run_on_ray_grows_and_shrinks_its_rollout_workers_between_steps(
        ray_gpus, tmp_path, model_cache):
    summary, events = resized_run(tmp_path)

    assert (summary.status, summary.steps_done) == ("succeeded", 4)
    workers = [e.values[M.ROLLOUT_WORKERS] for e in events
               if isinstance(e, MetricsEvent) and M.ROLLOUT_WORKERS in e.values]
    assert workers == [1.0, 2.0, 2.0, 1.0]
    grown, shrunk = [e for e in events if isinstance(e, WorkersResizedEvent)]
    assert (grown.step, grown.previous, grown.workers) == (1, 1, 2)
    assert grown.fingerprints == [grown.fingerprint_learner] and grown.fingerprint_learner
    assert grown.devices == ["gpu:0", "gpu:2"]
    # the weights it got are the ones the learner sent the other worker for that version
    sync = next(e for e in events if isinstance(e, WeightSyncEvent)
                and e.version_learner == grown.version)
    assert sync.fingerprint_learner == grown.fingerprint_learner
    assert (shrunk.step, shrunk.previous, shrunk.workers, shrunk.fingerprints) == (3, 2, 1, [])
    assert shrunk.devices == ["gpu:0"]
    assert all(e.matched for e in events if isinstance(e, WeightSyncEvent))

    applied = {e.control_id: e for e in events if isinstance(e, ControlAppliedEvent)}
    assert applied[1].message.startswith("rollout workers 1 -> 2 from step 1")
    assert applied[2].message.startswith("refused: set_rollout_workers 9: 7 more rollout "
                                         "worker(s) asks for 7 GPUs")
    assert "the run goes on with 2 rollout worker(s)" in applied[2].message
    assert any(e.level == "warning" and e.message.startswith("refused")
               for e in events if isinstance(e, LogEvent))

    # the new worker generated, and only after it served the weights
    on_new = [e for e in events if isinstance(e, SpanEvent) and e.device == "gpu:2"]
    first_sync = min(e.end for e in on_new if e.phase == "weight_sync")
    rollouts = [e for e in on_new if e.phase == "rollout"]
    assert rollouts and all(e.start >= first_sync for e in rollouts)
    assert all(e.step < 3 for e in rollouts)             # gone from step 3 on
    assert shared.ray_released(ray_gpus)                 # its own group removed with it


@pytest.mark.parametrize("placement,sync,words", [
    ({"type": "colocated"}, {"type": "in_place"}, "placement.ray = false"),
    ({"type": "disaggregated"}, {"type": "broadcast"}, 'weight_sync.type = "broadcast"'),
])
def test_a_run_whose_workers_cannot_change_is_refused_naming_the_field_and_fix(
        placement, sync, words):
    cfg = small_run(placement=placement, weight_sync=sync)

    with pytest.raises(ControlError) as caught:
        check_control(validate_control({"kind": "set_rollout_workers", "value": 2}), cfg)

    [(field, message)] = caught.value.errors
    assert field == "kind" and words in message and "to resize it live" in message


@pytest.mark.parametrize("value,words", [
    (0, "greater than or equal to 1"), (1025, "less than or equal to 1024"),
    (1.5, "integer"), (None, "required"),
])
def test_a_worker_count_out_of_bounds_names_the_value(value, words):
    data = {"kind": "set_rollout_workers"} | ({} if value is None else {"value": value})
    with pytest.raises(ControlError) as caught:
        validate_control(data)

    [(field, message)] = caught.value.errors
    assert field == "value" and words in message


class Places:
    def __init__(self):
        self.used = []

    @property
    def devices(self):
        return [f"gpu:{i}" for i in range(len(self.used))]

    def check_room(self, more):
        pass


class Deployment:
    """Resizing's seam: adds a worker serving ``served`` until ``room`` runs out."""

    def __init__(self, room: int, served: str = "fp-2"):
        self.workers, self.room, self.served, self.places = ["w0"], room, served, Places()

    def add_worker(self, step):
        if len(self.workers) >= self.room:
            raise PlacementError("Ray did not grant the placement group within 1 s")
        self.workers.append(f"w{len(self.workers)}")
        return SyncResult(transport="object_store", step=step, version_learner=2,
                          version_rollout=2, fingerprint_learner="fp-2",
                          fingerprint_rollout=self.served, bytes=8, latency_s=0.1,
                          workers=(WeightReport(2, self.served, 8),))

    def retire_worker(self):
        self.workers.pop()
        return []


class Policy:
    def __init__(self):
        self.calls = []

    def joined(self, version):
        self.calls.append(("joined", version))

    def retire(self, worker):
        self.calls.append(("retire", worker))


def resizing(room: int, served: str = "fp-2") -> tuple[Resizing, MemorySink]:
    sink = MemorySink()
    cfg = small_run(placement={"type": "disaggregated"}, weight_sync={"type": "object_store"})
    return Resizing(Deployment(room, served), Policy(), Telemetry(sink, ["gpu:0"]), cfg), sink


def test_workers_the_cluster_cannot_place_in_time_leave_again_and_the_control_is_refused():
    r, sink = resizing(room=2)

    message = r.resize(3, step=4, version=2)

    assert message.startswith("refused: set_rollout_workers 3: Ray did not grant")
    assert r.d.workers == ["w0"] and not sink.of_type(WorkersResizedEvent)
    assert r.policy.calls == [("joined", 2), ("retire", 1)]       # the one added, gone
    [warning] = [e for e in sink.of_type(LogEvent) if e.level == "warning"]
    assert "the run goes on with 1 rollout worker(s)" in warning.message


def test_a_new_worker_serving_other_weights_is_taken_out_and_the_control_refused():
    r, sink = resizing(room=4, served="fp-stale")

    message = r.resize(2, step=4, version=2)

    assert "does not serve the learner's weights" in message and r.d.workers == ["w0"]
    assert not sink.of_type(WorkersResizedEvent)


def test_shrinking_retires_the_last_workers_after_their_work_and_reports_it():
    r, sink = resizing(room=4)
    r.resize(3, step=1, version=1)

    message = r.resize(1, step=5, version=3)

    assert message == "rollout workers 3 -> 1 from step 5"
    assert r.policy.calls[-2:] == [("retire", 2), ("retire", 1)]
    grown, shrunk = sink.of_type(WorkersResizedEvent)
    assert grown.fingerprints == ["fp-2", "fp-2"] and shrunk.fingerprints == []
    assert r.resize(1, step=6, version=3) == "already 1 rollout worker(s)"


def test_a_run_holds_its_launch_bundles_and_one_per_worker_beyond_them():
    split = layout_for(small_run(placement={
        "type": "disaggregated", "rollout_workers": 2, "devices_per_worker": 2},
        weight_sync={"type": "object_store"}).placement)
    colocated = layout_for(small_run(placement={"type": "colocated", "ray": True,
                                                "devices": 2},
                                     weight_sync={"type": "shm"}).placement)

    assert grown_bundles(split, 1) == grown_bundles(split, 2) == [{"GPU": 2.0}] * 2 + [
        {"GPU": 1.0}]
    assert grown_bundles(split, 4) == [*split.bundles, {"GPU": 2.0}, {"GPU": 2.0}]
    assert grown_bundles(colocated, 3) == [{"GPU": 1.0}] * 3


def test_a_launch_workers_bundle_stays_reserved_and_the_next_worker_takes_it_first():
    layout = layout_for(small_run(placement={"type": "disaggregated", "rollout_workers": 2},
                                  weight_sync={"type": "object_store"}).placement)
    places = RolloutPlaces(layout, pg="the run's group", timeout_s=1.0)

    left = places.give_back()                  # worker 1 leaves: no group to remove

    assert (left.slot.devices, left.own) == (["gpu:1"], False)
    assert places.devices == ["gpu:0", "gpu:1", "gpu:2"]     # still held, idle
    assert places.take() is left and [p.slot.bundle for p in places.used] == [0, 1]


def test_a_joining_worker_serves_the_learners_weights_and_a_leaving_one_leaves_its_sync(
        tmp_path):
    named = _weights()
    session, source, engines, _ = _session(_shm(tmp_path, delta=True), named, workers=1)
    _push(session, source, named, 0, initial=True)
    later = _step(named, seed=1)
    source.named, source.version = list(later), 1
    newcomer = _Tensors(named)

    joined = session.join(LocalActor(EngineHost(newcomer)), step=1)

    assert joined.matched and joined.fingerprint_rollout == fingerprint(later)
    assert _serves(newcomer, later) and len(session.workers) == 2
    source.named, source.version = list(_step(later, seed=2)), 2
    session.send(2)                                  # in flight to both, not settled
    session.leave(1)
    [res] = session.settle(wait=True)
    assert res.matched and res.delta.base is None and len(res.workers) == 1   # sent full
    assert _serves(engines[0], source.named) and len(session.workers) == 1


def test_a_collective_transport_takes_no_new_worker_naming_the_ones_that_do():
    session = WeightSyncSession(None, [], validate_config(
        {"weight_sync": {"type": "broadcast"}}).weight_sync)

    with pytest.raises(RuntimeError, match='live needs "object_store" or "shm"'):
        session.join(None, step=3)
