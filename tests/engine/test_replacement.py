"""Replacing a dead rollout worker, at the deployment's seam: the run's budget, one
replacement per death however many calls see it, and a replacement that does not serve
the learner's weights fails the run. The real death, on Ray: test_faults_async.py."""

import pytest

from engine.events import LogEvent, WorkerReplacedEvent
from engine.orchestration.actors import death_cause
from engine.orchestration.replacement import Replacements, WorkerLostError, check_budget
from engine.rollout.base import WeightReport
from engine.telemetry.recorder import Telemetry
from engine.telemetry.sinks import MemorySink
from engine.weightsync.base import SyncResult


class Deployment:
    """The seam Replacements drives: the workers' places, what was found dead, and a
    replacement that reports the sync it got (serving ``served``)."""

    def __init__(self, served: str = "fp-3"):
        self.workers, self.lost, self.served = ["w0", "w1"], {}, served

    def replace_worker(self, index: int, step: int) -> SyncResult:
        self.workers[index] += "'"
        return SyncResult(transport="object_store", step=step, version_learner=3,
                          version_rollout=3, fingerprint_learner="fp-3",
                          fingerprint_rollout=self.served, bytes=8, latency_s=0.1,
                          workers=(WeightReport(3, self.served, 8),))


def replacements(limit: int, served: str = "fp-3") -> tuple[Replacements, MemorySink]:
    sink = MemorySink()
    return Replacements(Deployment(served), Telemetry(sink, ["gpu:0"]), limit), sink


def test_a_dead_worker_is_replaced_once_however_many_calls_see_it_die():
    r, sink = replacements(limit=3)
    r.d.lost[1] = ("w1", "its process died")        # a sync saw it first

    r.replace(1, "w1", "its process died", step=4)  # then its generation call
    r.replace_lost(step=4)

    [event] = sink.of_type(WorkerReplacedEvent)
    assert (event.step, event.worker, event.cause, event.replacements) == (
        4, 1, "its process died", 1)
    assert event.matched and event.fingerprint_worker == event.fingerprint_learner == "fp-3"
    assert r.d.workers == ["w0", "w1'"] and r.made == 1 and not r.d.lost
    assert any("rollout worker 1 replaced" in e.message for e in sink.of_type(LogEvent))


def test_past_its_bound_a_lost_worker_fails_the_run_naming_the_bound():
    r, _ = replacements(limit=1)
    r.replace(0, "w0", "its process died", step=2)

    with pytest.raises(WorkerLostError, match=r"already replaced 1 worker\(s\).*"
                                              r"placement.max_worker_replacements = 1"):
        r.replace(0, r.d.workers[0], "its process died", step=5)   # the replacement
    with pytest.raises(WorkerLostError, match="replacing workers is off"):
        check_budget(0, 0, 0, 1, "its process died")


def test_a_replacement_that_does_not_serve_the_learners_weights_fails_the_run():
    r, sink = replacements(limit=3, served="fp-old")

    with pytest.raises(WorkerLostError, match="does not serve the learner's weights"):
        r.replace(0, "w0", "its process died", step=2)
    [event] = sink.of_type(WorkerReplacedEvent)
    assert not event.matched


def test_rays_account_of_a_death_is_kept_to_its_cause_in_one_line():
    ray_says = ("The actor died unexpectedly before finishing this task.\n"
                "\tclass_name: RolloutWorker\n\tpid: 9376\n"
                "The actor is dead because its worker process has died. Worker exit type: "
                "SYSTEM_ERROR End of file. Some common causes include: (1) the OOM killer")

    assert death_cause(ray_says) == ("The actor is dead because its worker process has died. "
                                     "Worker exit type: SYSTEM_ERROR End of file.")
