"""A run whose driver and actors are on a node other than the control plane's Ray head
(issue 35 item 5): the control plane's real submit, sync, stop and fork path against a
two-node Ray cluster on this machine.

    head   (2 CPUs, no GPU)         the dashboard the control plane submits to
    node 1 (1 CPU, 2 logical GPUs,  the driver (RLPLANE_DRIVER_RESOURCES=rlplane_driver=1)
            rlplane_driver: 1)      and its placement's actors (rollout worker, learner)

Both nodes see the same RLPLANE_RUNS_DIR (one machine, as a shared mount makes it for
many): the driver checkpoints there, and the control plane lists the checkpoint and forks
from it. A driver that does not find the control plane's marker there (a node without
the mount) refuses to start, and its run fails naming the fix.

In CI the module runs once, in the PostgreSQL pass (marked ``postgres``); without
RLPLANE_TEST_DATABASE_URL, on SQLite. The ingest's websocket announcements go through the
machine's Redis (the ``channel_layer`` fixture).
"""


import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User

from jobs.cluster.status import state_rows
from jobs.models import Checkpoint, MetricPoint, Run, RunStatus
from jobs.runs import submit, tasks
from jobs.runs.actions import do_fork_run
from jobs.runs.queue import do_schedule_runs

from ..ray_head import RayHead
from .test_tasks import TINY, job_log, model_cache, run_to_end, unlocked, wait_for  # noqa: F401

# With RLPLANE_TEST_DATABASE_URL given, scripts/test runs this module in its PostgreSQL pass
# only (`postgres_only`): once is enough for a test this long.
pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.postgres_only,
              pytest.mark.django_db(transaction=True)]

DRIVER_RESOURCE = "rlplane_driver"
# One rollout worker and the learner, each an actor on a logical GPU of its own; weights
# travel through Ray's object store, which works between nodes.
CONFIG = {**TINY, "name": "multinode", "steps": 1000,
          "placement": {"type": "disaggregated", "rollout_workers": 1, "learner_devices": 1},
          "weight_sync": {"type": "object_store"}}


@pytest.fixture(scope="module")
def cluster():
    """A head with no GPU and a node with the GPUs and the drivers' resource, for the
    module. Yields the head."""
    head = RayHead(num_gpus=0)
    try:
        head.add_node(num_cpus=1, num_gpus=2, resources={DRIVER_RESOURCE: 1})
        head.wait_ready()
        yield head
    finally:
        head.stop()


@pytest.fixture
def two_nodes(cluster, settings, monkeypatch, tmp_path, live_server, model_cache,  # noqa: F811
              channel_layer):
    """The control plane's settings pointed at the cluster and at the live server. Yields
    the Ray Jobs client and the GPU node's id."""
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    settings.RAY_DASHBOARD_ADDRESS = cluster.dashboard
    settings.RAY_AUTH_TOKEN_PATH = str(cluster.token_path)
    settings.RLPLANE_RUNS_DIR = tmp_path / "runs"
    settings.RLPLANE_URL = live_server.url
    settings.RLPLANE_DRIVER_RESOURCES = {DRIVER_RESOURCE: 1.0}

    def gpu_node():
        alive = [n for n in state_rows("/api/v0/nodes?limit=100") if n["state"] == "ALIVE"]
        return next((n["node_id"] for n in alive
                     if n["resources_total"].get(DRIVER_RESOURCE)), None)

    yield cluster.client(), wait_for(gpu_node, 60,
                                     what=f"node 1 to join (log: {cluster.node_logs[0]})")


def run_nodes(client, run: Run) -> tuple[str, set[str]]:
    """The node of the run's driver (Ray's job info) and the nodes of its actors (the state
    API), while it runs."""
    driver = client.get_job_info(run.ray_submission_id).driver_node_id
    job_id = client.get_job_info(run.ray_submission_id).job_id
    actors = [a for a in state_rows("/api/v0/actors?detail=1&limit=10000")
              if a.get("job_id") == job_id and a.get("state") == "ALIVE"]
    return driver, {a["node_id"] for a in actors}


def first_metrics(client, run: Run) -> None:
    def reported():
        return unlocked(MetricPoint.objects.filter(run=run, name="reward/mean").exists)

    try:
        wait_for(reported, 240, every_s=1.0, what="the first step's metrics")
    except AssertionError as exc:
        run.refresh_from_db()
        raise AssertionError(f"{exc}; run {run.status}: {run.status_reason}; its job's log:\n"
                             f"{job_log(client, run.ray_submission_id)}") from None


def test_a_run_on_a_node_other_than_the_head_checkpoints_stops_and_forks(two_nodes,
                                                                         monkeypatch):
    client, gpu_node = two_nodes
    run = Run.objects.create(name="multinode", config=CONFIG)
    submit.submit_run(run.pk)
    unlocked(run.refresh_from_db)
    first_metrics(client, run)

    driver, actors = run_nodes(client, run)
    assert driver == gpu_node
    assert actors == {gpu_node}            # the rollout worker's and the learner's

    unlocked(tasks.stop_run, run.pk)
    run_to_end(client, run)
    assert run.status == RunStatus.STOPPED, (run.status_reason,
                                             job_log(client, run.ray_submission_id))
    (checkpoint, *_) = Checkpoint.forkable(run)       # listed: on the shared runs dir
    assert checkpoint.directory().is_relative_to(django_settings.RLPLANE_RUNS_DIR)

    monkeypatch.setattr(submit.submit_run, "delay", lambda run_id: submit.submit_run(run_id))
    # The fork trains in its driver's process (the default placement): its driver still
    # lands on node 1, and it starts faster than two more actors would.
    config = {**TINY, "name": "multinode-fork", "steps": checkpoint.step + 1}
    fork = do_fork_run(User.objects.create_user("olga"), run, checkpoint, config)

    def submitted():  # admitted and submitted by the queue, as beat would
        unlocked(do_schedule_runs)
        unlocked(fork.refresh_from_db)
        return fork.ray_submission_id

    wait_for(submitted, 60, what=f"the queue to admit the fork ({fork.status_reason})")
    run_to_end(client, fork)

    assert fork.status == RunStatus.SUCCEEDED, (fork.status_reason,
                                                job_log(client, fork.ray_submission_id))
    assert client.get_job_info(fork.ray_submission_id).driver_node_id == gpu_node
    steps = MetricPoint.objects.filter(run=fork, name="reward/mean").values_list("step",
                                                                                 flat=True)
    assert list(steps) == [checkpoint.step]     # it went on from the parent's checkpoint


def test_a_driver_whose_node_does_not_see_its_run_dir_refuses_and_the_run_fails(
        two_nodes, monkeypatch):
    """The control plane's run dir and marker, absent where the driver runs: what a node
    without the shared mount at RLPLANE_RUNS_DIR sees."""
    client, _ = two_nodes
    monkeypatch.setattr(submit, "mark_run_dir", lambda run_dir, key: None)
    run = Run.objects.create(name="unshared", config=TINY)
    submit.submit_run(run.pk)

    run_to_end(client, run)

    assert run.status == RunStatus.FAILED, run.status_reason
    assert "has no marker" in run.status_reason             # the driver's own words
    assert "RLPLANE_RUNS_DIR" in run.status_reason and "shared storage" in run.status_reason
    assert run.restarts == []                               # exit 2: it would fail again
    assert not (django_settings.RLPLANE_RUNS_DIR / f"run-{run.pk}").exists()
