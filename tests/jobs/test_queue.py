"""The capacity-aware queue (jobs/runs/queue.py): a queued run starts when its placement fits,
priority then FIFO, and says what it waits for. In-process runs share RLPLANE_MAX_LOCAL_RUNS
slots; Ray placements are weighed against a real Ray head's logical GPUs."""

import time

import pytest

from engine.api import WorkersResizedEvent
from engine.config import validate_config
from jobs.ingest.store import do_ingest_events
from jobs.models import Run, RunStatus
from jobs.runs import queue, submit, tasks
from jobs.runs.actions import do_set_priority, do_stop_run

from .helpers import status

pytestmark = pytest.mark.django_db

LOCAL = {"name": "local", "steps": 3}


def on_gpus(n: int, name: str = "gpu") -> dict:
    """A run whose placement reserves ``n`` logical GPUs on Ray."""
    return {"name": name, "steps": 3, "weight_sync": {"type": "shm"},
            "placement": {"type": "colocated", "ray": True, "devices": n}}


@pytest.fixture
def submitted(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(submit.submit_run, "delay", calls.append)
    monkeypatch.setattr(tasks.stop_run, "delay", lambda run_id: None)
    return calls


@pytest.fixture
def schedule(django_capture_on_commit_callbacks):
    """One pass of the queue, its on-commit submissions run."""
    def go() -> list[int]:
        with django_capture_on_commit_callbacks(execute=True):
            return queue.do_schedule_runs()
    return go


def queued(config: dict, **fields) -> Run:
    return Run.objects.create(name=config["name"], config=config, **fields)


def test_what_a_placement_asks_for():
    assert queue.demand_of(validate_config(LOCAL)) == {queue.RUN_SLOT: 1.0}
    assert queue.demand_of(validate_config(on_gpus(4))) == {"GPU": 4.0}
    split = {"weight_sync": {"type": "shm"}, "placement": {
        "type": "disaggregated", "rollout_workers": 3, "devices_per_worker": 2,
        "learner_devices": 2}}
    # 3 x 2 for rollout + 2 for the learner
    assert queue.demand_of(validate_config(split)) == {"GPU": 8.0}
    assert queue.wait_reason({"GPU": 2.0}, {"GPU": 0.0}, {"GPU": 4.0}) == \
        "waits for 2 GPUs; 0 of 4 free"


def test_every_driver_counts_its_driver_resources_and_waits_for_them_in_the_queue(
        settings, submitted, schedule, make_run, monkeypatch):
    settings.RLPLANE_DRIVER_RESOURCES = {"rlplane_driver": 1.0}
    settings.RLPLANE_MAX_LOCAL_RUNS = 4
    assert queue.demand_of(validate_config(LOCAL)) == {queue.RUN_SLOT: 1.0,
                                                       "rlplane_driver": 1.0}
    assert queue.demand_of(validate_config(on_gpus(2))) == {"GPU": 2.0, "rlplane_driver": 1.0}
    # one node may hold a driver (ray start --resources '{"rlplane_driver": 1}'), one runs
    monkeypatch.setattr(queue, "ray_capacity", lambda: ({"rlplane_driver": 1.0, "GPU": 4.0},
                                                        {}))
    holder = make_run(RunStatus.RUNNING)
    Run.objects.filter(pk=holder.pk).update(config=Run(config=LOCAL).config)
    waiting = queued(LOCAL)

    assert schedule() == []
    waiting.refresh_from_db()
    assert waiting.status_reason == "waits for 1 rlplane_driver; 0 of 1 free"
    # a cluster with no such node: refused at launch, naming the setting
    why = queue.never_reason(queue.demand_of(validate_config(LOCAL)), {"GPU": 4.0})
    assert "RLPLANE_DRIVER_RESOURCES" in why and "ray start --resources" in why


def test_with_one_local_slot_a_second_run_waits_and_starts_when_the_first_ends(
        settings, submitted, schedule, make_run, django_capture_on_commit_callbacks):
    settings.RLPLANE_MAX_LOCAL_RUNS = 1
    first, second = queued(LOCAL), queued(LOCAL)

    assert schedule() == [first.pk]
    second.refresh_from_db()
    assert second.status == RunStatus.QUEUED
    assert second.status_reason == "waits for 1 run slot; 0 of 1 free"

    Run.objects.filter(pk=first.pk).update(status=RunStatus.RUNNING)
    first.refresh_from_db()
    with django_capture_on_commit_callbacks(execute=True):
        # The engine's final status, through ingest, frees the slot and runs the queue.
        do_ingest_events(first, [status(1, "succeeded")])

    second.refresh_from_db()
    assert second.status == RunStatus.SUBMITTING and submitted == [first.pk, second.pk]


def test_the_higher_priority_starts_first_then_the_older(settings, submitted, schedule):
    settings.RLPLANE_MAX_LOCAL_RUNS = 2
    old, new, urgent = queued(LOCAL), queued(LOCAL), queued(LOCAL, priority=5)

    assert schedule() == [urgent.pk, old.pk]
    new.refresh_from_db()
    assert new.status == RunStatus.QUEUED


def test_a_cancelled_run_never_starts(settings, submitted, schedule, make_run):
    settings.RLPLANE_MAX_LOCAL_RUNS = 1
    make_run(RunStatus.RUNNING)
    waiting = queued(LOCAL)
    schedule()

    do_stop_run("olga", waiting)
    Run.objects.filter(status=RunStatus.RUNNING).update(status=RunStatus.SUCCEEDED)

    assert schedule() == [] and submitted == []
    waiting.refresh_from_db()
    assert waiting.status == RunStatus.STOPPED


def test_a_ray_placement_waits_while_ray_does_not_answer(settings, submitted, schedule,
                                                         monkeypatch):
    def unreachable(path):
        raise queue.ClusterUnreachable("http://ray: connection refused")
    monkeypatch.setattr(queue, "fetch_json", unreachable)
    run, local = queued(on_gpus(1)), queued(LOCAL)

    assert schedule() == [local.pk]
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and "connection refused" in run.status_reason


def a_cluster_of(monkeypatch, gpus: float) -> None:
    """Ray's answer (fetch_json, the seam): ``gpus`` logical GPUs, none in use."""
    usage = {"GPU": [0.0, gpus]}
    monkeypatch.setattr(queue, "fetch_json", lambda path: {
        "data": {"clusterStatus": {"loadMetricsReport": {"usage": usage}}}})


def resized(seq: int, workers: int, previous: int) -> WorkersResizedEvent:
    return WorkersResizedEvent(seq=seq, ts=1000.0 + seq, step=seq, previous=previous,
                               workers=workers)


def test_a_live_run_counts_the_workers_of_its_latest_resize_until_its_driver_starts_again(
        submitted, schedule, make_run, monkeypatch):
    a_cluster_of(monkeypatch, 4)
    holder = make_run(RunStatus.RUNNING)      # 1 rollout worker + learner: 2 GPUs
    Run.objects.filter(pk=holder.pk).update(config=Run(config={
        "name": "holder", "steps": 9, "weight_sync": {"type": "object_store"},
        "placement": {"type": "disaggregated"}}).config)
    holder.refresh_from_db()
    do_ingest_events(holder, [resized(1, workers=3, previous=1)])   # 2 more: 4 GPUs
    waiting = queued(on_gpus(1, "waiting"))

    assert schedule() == []
    waiting.refresh_from_db()
    assert waiting.status_reason == "waits for 1 GPU; 0 of 4 free"

    do_ingest_events(holder, [resized(2, workers=2, previous=3)])   # one given back
    assert schedule() == [waiting.pk]

    do_ingest_events(holder, [status(3, "starting")])               # a driver restarted
    holder.refresh_from_db()
    assert holder.rollout_workers is None
    assert queue.run_demand(holder) == {"GPU": 2.0}                   # the launch's


# --- against the session's Ray head, with 2 logical GPUs -------------------------------------

@pytest.fixture
def on_head(shared_ray_head, settings, monkeypatch):
    """Settings pointed at the session's head (2 logical GPUs, tests/shared.py), once it
    reports its resources (a fresh head's cluster status is empty for its first seconds;
    the queue then waits, saying so)."""
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    settings.RAY_DASHBOARD_ADDRESS = shared_ray_head.dashboard
    settings.RAY_AUTH_TOKEN_PATH = str(shared_ray_head.token_path)
    deadline = time.monotonic() + 60
    while True:
        try:
            queue.ray_capacity()
            return shared_ray_head
        except queue.ClusterUnreachable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@pytest.mark.slow
def test_on_a_two_gpu_head_a_run_asking_for_four_waits_with_the_reason(
        on_head, submitted, schedule):
    assert queue.ray_capacity()[0]["GPU"] == 2.0
    big = queued(on_gpus(4, "big"))

    assert schedule() == []

    big.refresh_from_db()
    assert big.status == RunStatus.QUEUED
    assert big.status_reason == "waits for 4 GPUs; 2 of 2 free"


@pytest.mark.slow
def test_on_a_two_gpu_head_a_priority_change_reorders_two_waiting_runs(
        on_head, submitted, schedule, make_run, django_capture_on_commit_callbacks):
    holder = make_run(RunStatus.RUNNING)
    Run.objects.filter(pk=holder.pk).update(config=Run(config=on_gpus(2)).config)
    first, second = queued(on_gpus(2, "first")), queued(on_gpus(2, "second"))

    assert schedule() == []
    first.refresh_from_db()
    assert first.status_reason == "waits for 2 GPUs; 0 of 2 free"

    with django_capture_on_commit_callbacks(execute=True):
        do_set_priority("olga", second, 10)
    Run.objects.filter(pk=holder.pk).update(status=RunStatus.SUCCEEDED)

    assert schedule() == [second.pk]
    first.refresh_from_db()
    assert first.status == RunStatus.QUEUED and submitted == [second.pk]


# --- the run page -------------------------------------------------------------------------------

def test_a_queued_runs_page_says_why_it_waits_and_operators_reorder_or_cancel_it(
        client, operator, submitted, settings, make_run, django_capture_on_commit_callbacks):
    settings.RLPLANE_MAX_LOCAL_RUNS = 1
    make_run(RunStatus.RUNNING)  # holds the one slot
    waiting = queued(LOCAL)
    with django_capture_on_commit_callbacks(execute=True):
        queue.do_schedule_runs()

    page = operator.get(f"/runs/{waiting.pk}").content.decode()
    assert 'id="queue-reason"' in page and "waits for 1 run slot; 0 of 1 free" in page
    assert 'id="priority-form"' in page and ">Cancel</button>" in page

    with django_capture_on_commit_callbacks(execute=True):
        operator.post(f"/runs/{waiting.pk}/priority", {"priority": "3"})
    waiting.refresh_from_db()
    assert waiting.priority == 3
    operator.post(f"/runs/{waiting.pk}/stop")
    waiting.refresh_from_db()
    assert waiting.status == RunStatus.STOPPED


def test_a_viewer_cannot_change_a_queued_runs_priority(client, django_user_model):
    waiting = queued(LOCAL)
    client.force_login(django_user_model.objects.create_user("vic"))

    assert client.post(f"/runs/{waiting.pk}/priority", {"priority": "3"}).status_code == 403
    page = client.get(f"/runs/{waiting.pk}").content.decode()
    assert 'id="priority-form"' not in page
    waiting.refresh_from_db()
    assert waiting.priority == 0


def test_a_queued_run_whose_stored_config_no_longer_validates_fails_and_the_next_starts(
        settings, submitted, schedule):
    settings.RLPLANE_MAX_LOCAL_RUNS = 1
    stale = queued({"name": "stale", "steps": 3}, priority=5)
    behind = queued(LOCAL)
    # After an upgrade or a database edit: a stored config the engine no longer accepts.
    Run.objects.filter(pk=stale.pk).update(config={"name": "stale", "steps": 3,
                                                   "rollout": {"temperature": 9}})

    assert schedule() == [behind.pk]

    stale.refresh_from_db()
    assert stale.status == RunStatus.FAILED
    assert stale.status_reason.startswith("its stored config no longer validates")
    assert "rollout.temperature" in stale.status_reason
    assert submitted == [behind.pk]
