"""Celery tasks that follow and stop runs: short ones only. The run itself is a Ray job that
outlives any worker; submitting it is jobs/runs/submit.py.

    sync_runs()       beat, every 10 s: each live run vs its Ray job's status;
                      a job that ended -> first what its driver wrote to the run's
                      directory (jobs/runs/reconcile.py), then a driver killed by a
                      signal or failed with no final status -> submitted again while
                      run.max_restarts allows (jobs/runs/restart.py), else lost
                      (killed) or failed; a job Ray no longer knows -> lost;
                      a run never submitted -> again; the queue
                      (jobs/runs/queue.py) admits what now fits; then a launched
                      command's new output -> its log panel (jobs/runs/job_logs.py)
                      and, last, a run still live RLPLANE_STOP_TIMEOUT_S after its stop
                      request -> enforce_stop
    stop_run(id)      running -> stopping + the flag the driver polls
    enforce_stop(id)  still not exited after the timeout: stop the Ray job

The stop's deadline is kept by sync_runs (run.stop_requested_at), not by a task queued
with a countdown: Celery holds such a task unacknowledged in the worker until its ETA,
and a Redis that dies meanwhile makes kombu's restore of it crash the worker
("Unrecoverable error: AttributeError" in the channel's close, kombu 5.7; the stack drill
saw the extra restart); the task was lost with that Redis too, and the run stayed
"stopping" for good.
"""

from __future__ import annotations

import logging
import signal
from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from jobs.cluster.ray import job_not_found, ray_jobs
from jobs.models import LIVE, InvalidTransition, Run, RunStatus
from jobs.runs.job_logs import follow_job_logs
from jobs.runs.queue import do_schedule_runs
from jobs.runs.reconcile import do_reconcile_run
from jobs.runs.restart import restart_driver, restarts_left
from jobs.runs.submit import submit_run

logger = logging.getLogger(__name__)


@shared_task
def sync_runs() -> None:
    """Follow each live run's Ray job. The engine's own status events are the main path;
    this catches what they cannot say: a driver that died, a job stopped or lost. A
    launched command may report nothing at all: its job's status is its run's."""
    resubmit_stuck_runs()
    follow_ray_jobs()
    enforce_overdue_stops()
    do_schedule_runs()
    follow_job_logs()  # after follow_ray_jobs: a job that just ended gives its last lines


def follow_ray_jobs() -> None:
    runs = list(Run.objects.filter(status__in=LIVE).exclude(ray_submission_id=""))
    if not runs:
        return
    from ray.job_submission import JobStatus

    client = ray_jobs()
    for run in runs:
        try:
            info = client.get_job_info(run.ray_submission_id)
        except RuntimeError as exc:
            if not job_not_found(exc):
                raise
            do_reconcile_run(run)
            follow(run, RunStatus.LOST, f"Ray has no job {run.ray_submission_id} any more "
                                        "(the cluster restarted, or the job was deleted)")
            continue
        if info.status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
            # What the driver could not deliver (its spool, its last checkpoint, its final
            # status) comes first: the engine's own word beats what the job says.
            do_reconcile_run(run)
        if info.status == JobStatus.RUNNING and run.is_external:
            # The engine says "running" itself; a command may never say anything.
            if run.status == RunStatus.SUBMITTING:
                follow(run, RunStatus.RUNNING, f"its Ray job {run.ray_submission_id} runs")
        elif info.status == JobStatus.SUCCEEDED:
            # The driver exited 0 after its final status; if that event never arrived
            # (spooled while the control plane was down, or a command that reports no
            # status), say what the job says.
            stopped = run.stop_requested_at is not None
            follow(run, RunStatus.STOPPED if stopped else RunStatus.SUCCEEDED,
                   f"the Ray job {run.ray_submission_id} exited 0")
        elif info.status == JobStatus.FAILED and (killer := killed_by(info)):
            cause = (f"the run's driver was killed ({killer}) before it could report; its "
                     f"Ray job {run.ray_submission_id} is gone")
            if not restarted(run, client, cause):
                follow(run, RunStatus.LOST, cause)
        elif info.status == JobStatus.FAILED:
            cause = f"the Ray job failed: {info.message}"
            if info.driver_exit_code == BAD_ARGUMENTS or not restarted(run, client, cause):
                follow(run, RunStatus.FAILED, cause)
        elif info.status == JobStatus.STOPPED:
            follow(run, RunStatus.STOPPED, f"the Ray job was stopped: {info.message}")


BAD_ARGUMENTS = 2  # engine.ray_job's exit status for a bad config: a restart fails again


def restarted(run: Run, client, cause: str) -> bool:
    """Whether the run's driver, ended by ``cause`` with the run still live after
    reconciling, was submitted again (run.max_restarts, jobs/runs/restart.py) or its
    restart failed and the run is lost for it; False: no restart is left."""
    run.refresh_from_db()
    if run.status not in LIVE or not restarts_left(run):
        return False
    try:
        restart_driver(run, client, cause)
    except (RuntimeError, OSError) as exc:     # the job client's errors
        logger.warning("sync_runs: restarting run %s failed: %s", run.pk, exc)
        follow(run, RunStatus.LOST, f"{cause}; submitting its driver again failed: {exc}")
    return True


def killed_by(info) -> str | None:
    """The signal that killed a failed job's driver (the OOM killer, a lost node, an
    operator's kill -9), or None when the driver exited on its own. A killed driver
    never said why: the run is lost, not failed (RunLost), and may be forked."""
    code = info.driver_exit_code
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def resubmit_stuck_runs() -> None:
    """Queue submit_run again for admitted runs that no submission reached (a message lost
    with the broker or a worker): submit_run is idempotent per run, so a late twin is
    harmless. Queued runs are the queue's (do_schedule_runs admits them). How long a run
    waits first: RLPLANE_RESUBMIT_AFTER_S."""
    cutoff = timezone.now() - timedelta(seconds=settings.RLPLANE_RESUBMIT_AFTER_S)
    stuck = Run.objects.filter(status=RunStatus.SUBMITTING, ray_submission_id="",
                               created_at__lt=cutoff)
    for run_id in stuck.values_list("pk", flat=True):
        logger.warning("sync_runs: run %s was never submitted; queueing submit_run again",
                       run_id)
        submit_run.delay(run_id)


def follow(run: Run, target: RunStatus, reason: str) -> None:
    """Move a live run to what its Ray job says, unless ingest (or another worker) got
    there first."""
    try:
        run.advance_to(target, reason)
    except InvalidTransition as exc:
        logger.info("sync_runs: %s", exc)


@shared_task
def stop_run(run_id: int) -> None:
    """Ask the driver to checkpoint and exit; sync_runs stops its Ray job if it has not
    RLPLANE_STOP_TIMEOUT_S after the request (enforce_overdue_stops)."""
    run = Run.objects.get(pk=run_id)
    if run.is_terminal:
        return
    run.request_stop("stop requested")


def enforce_overdue_stops() -> None:
    """enforce_stop for each live run whose stop was asked RLPLANE_STOP_TIMEOUT_S ago or
    more (one that cannot be stopped now is tried again at the next sync)."""
    cutoff = timezone.now() - timedelta(seconds=settings.RLPLANE_STOP_TIMEOUT_S)
    overdue = Run.objects.filter(status__in=LIVE, stop_requested_at__lte=cutoff)
    for run_id in overdue.values_list("pk", flat=True):
        try:
            enforce_stop(run_id)
        except RuntimeError as exc:     # the job client's errors
            logger.warning("sync_runs: stopping the Ray job of run %s failed: %s", run_id, exc)


@shared_task
def enforce_stop(run_id: int) -> None:
    """Stop the Ray job of a run still live after its stop's timeout (sync_runs calls
    it). A task still, so that one an earlier version queued with a countdown runs."""
    run = Run.objects.get(pk=run_id)
    if run.is_terminal:
        return
    if not run.ray_submission_id:
        if run.is_external and run.status == RunStatus.STOPPING:
            # its process runs elsewhere and has not said it stopped: nothing here can end
            # it, so the run stops being watched instead of staying "stopping" for good
            follow(run, RunStatus.STOPPED, "its process did not report stopping within "
                   f"{settings.RLPLANE_STOP_TIMEOUT_S:g} s of the stop request; rlplane "
                   "stopped watching it (end it where it runs)")
        return
    try:
        ray_jobs().stop_job(run.ray_submission_id)
    except RuntimeError as exc:
        if not job_not_found(exc):
            raise
    follow(run, RunStatus.STOPPED, "the driver did not exit after the stop request; "
                                   f"its Ray job {run.ray_submission_id} was stopped")
