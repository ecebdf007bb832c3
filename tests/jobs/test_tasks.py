"""Celery tasks against a real local Ray head (token auth on), called directly (eagerly).

The head is the session's shared one (tests/shared.py: `ray start --head --block` in a
session of its own, on free ports and in its own temp dir, killed by that session after
its last user); each test's runs get Ray jobs of a name of its own there.
The end-to-end tests run the real `python -m engine.ray_job` as a Ray job that posts to the
ingest endpoint of pytest-django's live_server.
"""

import json
import os
import shlex
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User
from django.db import OperationalError
from django.utils import timezone
from ray.job_submission import JobStatus

from controlplane.processes import free_port
from jobs.cluster.ray import submission_id
from jobs.models import Checkpoint, MetricPoint, Run, RunControl, RunEvent, RunStatus
from jobs.runs import submit, tasks
from jobs.runs.actions import do_fork_run
from jobs.runs.restart import carry_controls

TERMINAL_JOB = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}

# A run that takes seconds, not minutes: random init, tiny eval, 2 prompts x 2 samples.
TINY = {
    "name": "ray-e2e", "steps": 1,
    "task": {"ops": ["+", "-"], "max_digits": 1, "eval_size": 8},
    "warm_start": {"steps": 0},
    "algorithm": {"group_size": 2, "minibatches": 1, "lr": 1e-3},
    "rollout": {"prompts_per_step": 2, "max_new_tokens": 4},
    "telemetry": {"eval_samples": 1},
}


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory):
    """The drivers build the tiny model into a per-module cache (nothing downloaded)."""
    previous = os.environ.get("RLPLANE_CACHE")
    if previous is None:
        os.environ["RLPLANE_CACHE"] = str(tmp_path_factory.mktemp("rlplane-cache"))
    yield os.environ["RLPLANE_CACHE"]
    if previous is None:
        del os.environ["RLPLANE_CACHE"]


@pytest.fixture
def cluster(shared_ray_head, settings, monkeypatch, tmp_path):
    """The control plane's settings pointed at the test head."""
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    settings.RAY_DASHBOARD_ADDRESS = shared_ray_head.dashboard
    settings.RAY_AUTH_TOKEN_PATH = str(shared_ray_head.token_path)
    settings.RLPLANE_RUNS_DIR = tmp_path / "runs"
    return shared_ray_head.client()


def make_stop_overdue(run: Run) -> None:
    """RLPLANE_STOP_TIMEOUT_S passes: the run's stop request moved back by it, nothing
    waited for."""
    unlocked(Run.objects.filter(pk=run.pk).update, stop_requested_at=timezone.now()
             - timedelta(seconds=django_settings.RLPLANE_STOP_TIMEOUT_S + 1))


def submit_raw(client, entrypoint: str) -> str:
    """A Ray job that is not the engine's entry (a driver that hangs, one that crashes)."""
    return client.submit_job(entrypoint=entrypoint,
                             submission_id=f"rlplane-test-{uuid.uuid4().hex[:8]}")


def wait_for(predicate, timeout_s: float, every_s: float = 0.5, what: str = ""):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what or predicate}")


def job_log(client, sid: str) -> str:
    try:
        return client.get_job_logs(sid)[-4000:]
    except RuntimeError as exc:
        return str(exc)


# --- the stop flag in the driver's poll (no Ray needed) ------------------------------------

@pytest.mark.django_db
def test_the_drivers_poll_answers_the_run_token_with_the_stop_flag(client, make_run):
    run = make_run(RunStatus.RUNNING)
    token = run.issue_ingest_token()
    headers = {"Authorization": f"Bearer {token}"}

    assert client.get(f"/api/runs/{run.pk}/controls", headers=headers).json()["stop"] is False
    run.request_stop("operator asked")
    assert client.get(f"/api/runs/{run.pk}/controls", headers=headers).json()["stop"] is True


@pytest.mark.django_db
def test_the_drivers_poll_refuses_other_tokens(client, make_run):
    run, other = make_run(), make_run()
    run.issue_ingest_token()
    other_token = other.issue_ingest_token()

    assert client.get(f"/api/runs/{run.pk}/controls").status_code == 401
    response = client.get(f"/api/runs/{run.pk}/controls",
                          headers={"Authorization": f"Bearer {other_token}"})
    assert response.status_code == 403
    assert client.post(f"/api/runs/{run.pk}/controls").status_code == 405


# --- submit_run ----------------------------------------------------------------------------

@pytest.mark.django_db
def test_submit_run_marks_the_run_failed_when_ray_cannot_be_reached(make_run, settings):
    settings.RAY_DASHBOARD_ADDRESS = f"http://127.0.0.1:{free_port()}"
    run = make_run(RunStatus.QUEUED)

    submit.submit_run(run.pk)

    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert "could not submit the Ray job rlplane-run-" in run.status_reason


@pytest.mark.django_db
def test_submit_run_leaves_a_run_that_is_past_submission_alone(make_run, settings):
    settings.RAY_DASHBOARD_ADDRESS = f"http://127.0.0.1:{free_port()}"  # never reached
    run = make_run(RunStatus.STOPPED)
    submit.submit_run(run.pk)
    run.refresh_from_db()
    assert run.status == RunStatus.STOPPED and run.ray_submission_id == ""


class RayJobsSeam:
    """The Ray Jobs client at its seam: the first submission of an id wins and a second
    one is refused as Ray refuses it. The first ``blind_checks`` lookups find no job, as
    two twins that both look before either submits do."""

    def __init__(self, blind_checks: int = 0, on_first_submit=None):
        self.jobs: dict[str, dict] = {}
        self.blind_checks = blind_checks
        self.on_first_submit = on_first_submit     # runs once Ray has the first job

    def get_job_info(self, sid):
        self.blind_checks -= 1
        if sid not in self.jobs or self.blind_checks >= 0:
            raise RuntimeError(f"Job {sid} does not exist")
        return self.jobs[sid]

    def submit_job(self, entrypoint, submission_id, runtime_env, metadata):
        if submission_id in self.jobs:
            raise RuntimeError(f"Job with submission_id {submission_id} already exists")
        self.jobs[submission_id] = runtime_env["env_vars"]
        hook, self.on_first_submit = self.on_first_submit, None
        if hook is not None:
            hook()


@pytest.mark.django_db
def test_of_two_racing_submitters_only_one_mints_a_token_and_it_is_the_one_ray_holds(
        make_run):
    run = make_run(RunStatus.SUBMITTING)
    twin_a, twin_b = Run.objects.get(pk=run.pk), Run.objects.get(pk=run.pk)  # same state
    ray_jobs = RayJobsSeam(blind_checks=2)      # both look before either has submitted

    submit.submit_once(twin_a, ray_jobs)
    submit.submit_once(twin_b, ray_jobs)   # read the run before A minted: must not revoke

    (env,) = ray_jobs.jobs.values()
    token = next(v for k, v in env.items() if "TOKEN" in k)
    run.refresh_from_db()
    assert run.has_ingest_token(token)
    assert run.ray_submission_id == submission_id(run.pk)


@pytest.mark.django_db
def test_a_twin_that_minted_after_the_winner_but_reached_ray_second_puts_its_token_back(
        make_run):
    run = make_run(RunStatus.SUBMITTING)
    # B reads the run after A's claim, looks before Ray has A's job, submits after it does
    late_twin = lambda: submit.submit_once(Run.objects.get(pk=run.pk), ray_jobs)  # noqa: E731
    ray_jobs = RayJobsSeam(blind_checks=2, on_first_submit=late_twin)

    submit.submit_once(Run.objects.get(pk=run.pk), ray_jobs)

    (env,) = ray_jobs.jobs.values()
    token = next(v for k, v in env.items() if "TOKEN" in k)
    run.refresh_from_db()
    assert run.has_ingest_token(token)


@pytest.mark.django_db
def test_the_driver_command_uses_this_python_checkout_and_checkpoint(make_run, settings):
    settings.RLPLANE_URL = "http://cp.example:8000/"
    run = make_run(RunStatus.QUEUED, source_checkpoint="/runs/run-1/checkpoints/step_000004")

    command = submit.driver_entrypoint(run)

    assert command.startswith(f"cd {settings.BASE_DIR} && exec {sys.executable} -m engine.ray_job")
    assert f"--ingest-url http://cp.example:8000/api/runs/{run.pk}/events" in command
    assert f"--controls-url http://cp.example:8000/api/runs/{run.pk}/controls" in command
    assert "--from-checkpoint /runs/run-1/checkpoints/step_000004" in command
    assert "--token-env RLPLANE_INGEST_TOKEN" in command and "--resume" in command
    assert f"--run-dir-key 'run {run.pk} created {run.created_at.isoformat()}'" in command


@pytest.mark.django_db
def test_the_run_dir_is_marked_before_the_driver_is_submitted_with_its_resources(
        make_run, settings):
    """The driver checks the marker at start (engine.run_dir): it must be there before
    Ray can start it, holding the key its command names."""
    settings.RLPLANE_DRIVER_RESOURCES = {"rlplane_driver": 1.0}
    run = make_run(RunStatus.SUBMITTING)
    marker = settings.RLPLANE_RUNS_DIR / f"run-{run.pk}" / ".rlplane-run-dir"
    submitted = []

    class Ray(RayJobsSeam):
        def submit_job(self, entrypoint, submission_id, runtime_env, metadata,
                       entrypoint_resources):
            submitted.append((entrypoint, entrypoint_resources, marker.read_text()))

    submit.submit_once(run, Ray())

    ((entrypoint, resources, key),) = submitted
    assert resources == {"rlplane_driver": 1.0}
    assert key == submit.run_dir_key(run) and shlex.quote(key) in entrypoint


@pytest.mark.django_db
def test_admitted_runs_that_no_submission_reached_are_submitted_again(make_run, monkeypatch):
    queued = []
    monkeypatch.setattr(submit.submit_run, "delay", queued.append)
    waiting = make_run(RunStatus.QUEUED)  # the queue's to admit, not a lost submission
    stuck, fresh = make_run(RunStatus.SUBMITTING), make_run(RunStatus.SUBMITTING)
    Run.objects.filter(pk__in=[stuck.pk, waiting.pk]).update(
        created_at=timezone.now() - timedelta(minutes=5))

    tasks.resubmit_stuck_runs()

    assert queued == [stuck.pk] and fresh.pk not in queued and waiting.pk not in queued


@pytest.mark.django_db
def test_a_run_is_submitted_again_only_after_rlplane_resubmit_after_s(make_run, monkeypatch,
                                                                      settings):
    queued = []
    monkeypatch.setattr(submit.submit_run, "delay", queued.append)
    run = make_run(RunStatus.SUBMITTING)
    Run.objects.filter(pk=run.pk).update(created_at=timezone.now() - timedelta(seconds=30))
    settings.RLPLANE_RESUBMIT_AFTER_S = 60
    tasks.resubmit_stuck_runs()
    assert queued == []
    settings.RLPLANE_RESUBMIT_AFTER_S = 20
    tasks.resubmit_stuck_runs()
    assert queued == [run.pk]


# --- sync_runs and stop_run against the real head --------------------------------------------

@pytest.mark.django_db
def test_sync_runs_marks_a_run_whose_job_vanished_lost(cluster, make_run):
    run = make_run(RunStatus.RUNNING, ray_submission_id="rlplane-run-never-submitted")

    tasks.sync_runs()

    run.refresh_from_db()
    assert run.status == RunStatus.LOST
    assert "Ray has no job rlplane-run-never-submitted" in run.status_reason


@pytest.mark.django_db
def test_sync_runs_marks_a_run_failed_when_its_job_failed(cluster, make_run):
    sid = submit_raw(cluster, "echo engine exploded; exit 3")
    run = make_run(RunStatus.SUBMITTING, ray_submission_id=sid)
    Run.objects.filter(pk=run.pk).update(config={**run.config, "max_restarts": 0})
    wait_for(lambda: cluster.get_job_status(sid) in TERMINAL_JOB, 60, what="the job to end")

    tasks.sync_runs()

    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert "the Ray job failed" in run.status_reason and "exit code 3" in run.status_reason


def killed_driver(cluster, make_run, max_restarts: int, **fields) -> Run:
    """A live run whose Ray job's driver was SIGKILLed (the OOM killer, a lost node, an
    operator), allowed ``max_restarts``."""
    sid = submit_raw(cluster, "kill -9 $$")
    run = make_run(RunStatus.RUNNING, ray_submission_id=sid, **fields)
    Run.objects.filter(pk=run.pk).update(config={**run.config, "max_restarts": max_restarts})
    run.refresh_from_db()
    wait_for(lambda: cluster.get_job_status(sid) in TERMINAL_JOB, 60, what="the job to end")
    return run


@pytest.fixture
def restarted_driver(monkeypatch):
    """A restart's driver (submit.ray_submission, the seam) is killed as it starts, as its
    first was, so the test sees it submitted without training a model; the entrypoints it
    was given."""
    given: list[str] = []

    def killed(run, token):
        given.append(submit.driver_entrypoint(run))
        return {"entrypoint": "kill -9 $$",
                "runtime_env": {"env_vars": submit.driver_env(token)}}
    monkeypatch.setattr(submit, "ray_submission", killed)
    return given


@pytest.mark.django_db
def test_a_killed_driver_is_submitted_again_to_resume_and_only_max_restarts_times(
        cluster, make_run, restarted_driver):
    run = killed_driver(cluster, make_run, max_restarts=1)
    first = run.ray_submission_id
    token_hash = run.ingest_token_hash

    tasks.sync_runs()

    run.refresh_from_db()
    again = submission_id(run.pk, 1)
    assert run.status == RunStatus.RUNNING and run.ray_submission_id == again
    assert [r["job"] for r in run.restarts] == [first]
    assert "killed (SIGKILL)" in run.restarts[0]["cause"]
    assert "driver restarted (1 of 1" in run.status_reason
    assert run.ingest_token_hash != token_hash      # the dead driver's token is revoked
    assert len(restarted_driver) == 1 and "--resume" in restarted_driver[0]
    wait_for(lambda: cluster.get_job_status(again) in TERMINAL_JOB, 60, what="the job to end")

    tasks.sync_runs()                                # killed again: its one restart is spent

    run.refresh_from_db()
    assert run.status == RunStatus.LOST and f"Ray job {again} is gone" in run.status_reason
    assert len(run.restarts) == 1 and len(restarted_driver) == 1
    assert [j.submission_id for j in cluster.list_jobs()].count(again) == 1


@pytest.mark.django_db
def test_a_restarted_driver_is_asked_again_for_what_live_controls_set(
        cluster, make_run, restarted_driver):
    run = killed_driver(cluster, make_run, max_restarts=1)
    olga = User.objects.create_user("olga")
    now = timezone.now()
    for kind, value, applied in (("set_lr", 1e-4, now), ("set_eval_every", 5, now),
                                 ("set_lr", 5e-5, now), ("pause", None, now),
                                 ("resume", None, now), ("checkpoint", None, now),
                                 ("set_eval_every", 10, None)):     # still pending
        RunControl.objects.create(run=run, kind=kind, value=value, requested_by=olga,
                                  applied_at=applied, applied_step=None if applied is None
                                  else 12)
    before = RunControl.objects.count()

    tasks.sync_runs()

    again = RunControl.objects.filter(run=run).order_by("id")[before:]
    # the last learning rate only; the pending eval cadence comes later and wins; the
    # run was resumed, not paused; a checkpoint is not a setting
    assert [(c.kind, c.value, c.requested_by, c.applied_at) for c in again] == [
        ("set_lr", 5e-5, olga, None)]
    pending = RunControl.objects.filter(run=run, applied_at=None).values_list("kind", "value")
    assert list(pending) == [("set_eval_every", 10.0), ("set_lr", 5e-5)]


@pytest.mark.django_db
def test_a_paused_runs_restarted_driver_is_paused_again(make_run):
    run = make_run(RunStatus.RUNNING)
    RunControl.objects.create(run=run, kind="set_rollout_workers", value=3,
                              applied_at=timezone.now(), applied_step=4)
    RunControl.objects.create(run=run, kind="pause", applied_at=timezone.now(), applied_step=5)

    assert [(c.kind, c.value) for c in carry_controls(run)] == [
        ("set_rollout_workers", 3.0), ("pause", None)]


@pytest.mark.django_db
def test_a_driver_is_not_restarted_after_a_stop_request_or_the_engines_own_failure(
        cluster, make_run, restarted_driver):
    stopping = killed_driver(cluster, make_run, max_restarts=1,
                             stop_requested_at=timezone.now())
    bad_config = submit_raw(cluster, "exit 2")       # engine.ray_job's bad-arguments exit
    refused = make_run(RunStatus.SUBMITTING, ray_submission_id=bad_config)
    wait_for(lambda: cluster.get_job_status(bad_config) in TERMINAL_JOB, 60, what="the end")

    tasks.sync_runs()

    stopping.refresh_from_db()
    refused.refresh_from_db()
    assert stopping.status == RunStatus.LOST and refused.status == RunStatus.FAILED
    assert stopping.restarts == refused.restarts == [] and restarted_driver == []


@pytest.mark.django_db
def test_sync_runs_stops_the_job_of_a_driver_that_does_not_answer_its_stop(cluster, make_run,
                                                                          settings):
    sid = submit_raw(cluster, "sleep 600")
    run = make_run(RunStatus.RUNNING, ray_submission_id=sid)
    wait_for(lambda: cluster.get_job_status(sid) == JobStatus.RUNNING, 60, what="RUNNING")
    settings.RLPLANE_STOP_TIMEOUT_S = 600

    tasks.stop_run(run.pk)

    run.refresh_from_db()
    assert run.status == RunStatus.STOPPING and run.stop_requested_at is not None
    tasks.sync_runs()  # the job still runs, its stop not yet overdue: nothing to change
    assert Run.objects.get(pk=run.pk).status == RunStatus.STOPPING

    make_stop_overdue(run)
    tasks.sync_runs()

    run.refresh_from_db()
    assert run.status == RunStatus.STOPPED and "was stopped" in run.status_reason
    wait_for(lambda: cluster.get_job_status(sid) == JobStatus.STOPPED, 30, what="STOPPED")


@pytest.mark.django_db
def test_enforce_stop_leaves_a_run_that_already_stopped_alone(cluster, make_run):
    run = make_run(RunStatus.STOPPED, ray_submission_id="rlplane-run-gone")
    tasks.enforce_stop(run.pk)
    assert Run.objects.get(pk=run.pk).status == RunStatus.STOPPED


# --- end to end: the engine's Ray job entry, posting to ingest -------------------------

@pytest.fixture
def e2e(cluster, live_server, settings, model_cache):
    settings.RLPLANE_URL = live_server.url
    return cluster


def unlocked(fn, *args, **kwargs):
    """fn(), retried while SQLite says "database table is locked". The test database is
    in memory with a shared cache, where a writer (the live server's ingest thread) locks
    tables without a busy timeout; a file database in WAL mode, as deployed, waits instead.
    Ingest's own failures are retried by the driver's sink."""
    for _ in range(100):
        try:
            return fn(*args, **kwargs)
        except OperationalError as exc:
            if "locked" not in str(exc):
                raise
            time.sleep(0.1)
    return fn(*args, **kwargs)


def run_to_end(client, run: Run, timeout_s: float = 300) -> None:
    """Reconcile like beat does until the Ray job has ended, then once more."""
    sid = submission_id(run.pk)

    def ended():
        unlocked(tasks.sync_runs)
        return client.get_job_status(sid) in TERMINAL_JOB

    try:
        wait_for(ended, timeout_s, every_s=1.0, what=f"job {sid} to end")
    except AssertionError:
        raise AssertionError(f"job {sid} did not end; its log:\n{job_log(client, sid)}") from None
    tasks.sync_runs()
    run.refresh_from_db()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_submitted_run_runs_the_engine_on_ray_and_succeeds(e2e):
    run = Run.objects.create(name="e2e", config=TINY)

    unlocked(submit.submit_run, run.pk)
    unlocked(run.refresh_from_db)
    assert run.status == RunStatus.SUBMITTING, run.status_reason
    assert run.ray_submission_id == submission_id(run.pk)   # this test's prefix
    token_hash = run.ingest_token_hash

    unlocked(submit.submit_run, run.pk)  # a retry: the same job and token, no second copy
    unlocked(run.refresh_from_db)
    assert run.ingest_token_hash == token_hash
    assert [j.submission_id for j in e2e.list_jobs()].count(run.ray_submission_id) == 1

    run_to_end(e2e, run)

    assert run.status == RunStatus.SUCCEEDED, (run.status_reason,
                                               job_log(e2e, run.ray_submission_id))
    assert e2e.get_job_status(run.ray_submission_id) == JobStatus.SUCCEEDED
    seqs = list(RunEvent.objects.filter(run=run).values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))       # every event, no gap
    statuses = [e.payload["status"] for e in RunEvent.objects.filter(run=run, type="run.status")]
    assert statuses == ["starting", "warm_start", "running", "succeeded"]
    assert MetricPoint.objects.filter(run=run, name="reward/mean", step=0).exists()
    assert Checkpoint.objects.filter(run=run, step=1).exists()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_stopped_run_checkpoints_and_its_fork_continues_from_there(e2e, monkeypatch):
    run = Run.objects.create(name="e2e-stop", config={**TINY, "steps": 1000})
    submit.submit_run(run.pk)
    try:
        wait_for(lambda: unlocked(MetricPoint.objects.filter(run=run, name="reward/mean")
                                  .exists), 240, every_s=1.0, what="the first step's metrics")
    except AssertionError as exc:
        run.refresh_from_db()
        raise AssertionError(f"{exc}; run {run.status}: {run.status_reason}; its job's log:\n"
                             f"{job_log(e2e, submission_id(run.pk))}") from None

    unlocked(tasks.stop_run, run.pk)
    assert unlocked(Run.objects.get, pk=run.pk).status == RunStatus.STOPPING
    run_to_end(e2e, run)

    assert run.status == RunStatus.STOPPED, (run.status_reason,
                                             job_log(e2e, run.ray_submission_id))
    assert e2e.get_job_status(run.ray_submission_id) == JobStatus.SUCCEEDED  # exited itself
    checkpoint = Checkpoint.objects.filter(run=run).latest("step")
    assert 1 <= checkpoint.step < 1000
    assert json.loads((Path(checkpoint.path) / "state.json").read_text())["step"] == \
        checkpoint.step
    tasks.enforce_stop(run.pk)  # comes too late: the run is already stopped
    assert Run.objects.get(pk=run.pk).status == RunStatus.STOPPED

    # Fork it with another sampling temperature; the Celery task runs eagerly on commit.
    monkeypatch.setattr(submit.submit_run, "delay", lambda run_id: submit.submit_run(run_id))
    operator = User.objects.create_user("olga")
    config = {**TINY, "name": "e2e-fork", "steps": checkpoint.step + 1,
              "rollout": {**TINY["rollout"], "temperature": 0.7}}
    fork = do_fork_run(operator, run, checkpoint, config)
    run_to_end(e2e, fork)

    assert fork.status == RunStatus.SUCCEEDED, (fork.status_reason,
                                                job_log(e2e, fork.ray_submission_id))
    steps = MetricPoint.objects.filter(run=fork, name="reward/mean").values_list("step",
                                                                                 flat=True)
    assert list(steps) == [checkpoint.step]     # it went on from the parent's checkpoint
    assert RunEvent.objects.filter(run=fork).order_by("seq").first().seq == 1


@pytest.mark.django_db(transaction=True)
def test_a_worker_keeps_its_database_connection_across_tasks_and_drops_it_after_a_failure(
        monkeypatch):
    """Celery's fixup closed the connection around every task (a new PostgreSQL backend
    per debounced alert evaluation); ours close what a request would, and after a task
    that raised."""
    from types import SimpleNamespace

    from celery.fixups.django import DjangoWorkerFixup
    from django.db import connection

    from controlplane.celery import (
        app,
        close_db_connections_after_a_failure,
        close_old_db_connections,
    )

    assert DjangoWorkerFixup(app).db_reuse_max >= 100
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 60)
    connection.close()
    task = SimpleNamespace(request=SimpleNamespace(is_eager=False))

    def run_task(state):
        close_old_db_connections(task=task)
        Run.objects.count()
        close_db_connections_after_a_failure(task=task, state=state)

    run_task("SUCCESS")
    first = connection.connection
    run_task("SUCCESS")
    assert first is not None and connection.connection is first
    run_task("FAILURE")
    assert connection.connection is None
