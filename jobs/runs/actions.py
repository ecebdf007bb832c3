"""What an operator does to runs, in one place (the pages, the REST API and the CLI all come
here): launch, fork, stop, live controls, priority, archive, restore, delete. Each do_*
saves first and acts on commit, so nothing is announced or started that did not commit."""

from __future__ import annotations

import logging
import shutil
from functools import partial
from pathlib import Path

from django.db import transaction
from django.utils import timezone

from engine.api import Control, ControlError, check_control
from engine.config import validate_config
from jobs.models import Checkpoint, Run, RunControl, RunStatus
from jobs.models.run import run_directory
from jobs.runs.queue import demand_of, never_fits, resize_refusal, schedule_on_commit
from jobs.runs.tasks import stop_run

logger = logging.getLogger(__name__)


class Refused(Exception):
    """An action the run's state does not allow; the message says why, and ``field`` the
    config field it is about, where one is (the forms show it there)."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


def refuse_unplaceable(config: dict) -> None:
    """Refused, naming what is missing, for a placement the cluster could never hold."""
    if why := never_fits(demand_of(validate_config(config, check_files=False))):
        raise Refused(f"placement: {why}", field="placement")


def do_launch_run(user, name: str, config: dict, priority: int = 0) -> Run:
    """Save a queued run; once the row is committed the queue starts it when its
    placement fits (jobs/runs/queue.py). Raises Refused for a placement it never could.
    """
    refuse_unplaceable(config)
    with transaction.atomic():
        run = Run.objects.create(name=name, config=config, created_by=user, priority=priority)
        schedule_on_commit()
    return run


def do_create_external_run(user, config: dict, priority: int = 0) -> tuple[Run, str | None]:
    """Save a run another framework trains (``config`` is an external run's: a
    ``framework`` key; ValidationError names each bad field) and return it with its ingest
    token, the only time the raw token exists on this side. Without ``launch`` the user's
    process is already running elsewhere: the run is running from now and ends when the
    process reports a final status. With ``launch`` it waits in the queue like any run and
    is submitted as a Ray Job with the token in its environment."""
    launch = config.get("launch") if isinstance(config, dict) else None
    with transaction.atomic():
        run = Run(name=str(config.get("name") or "run"), config=config, created_by=user,
                  priority=priority)
        run.full_clean(exclude=["name", "ingest_token_hash"])
        token = None
        if launch:
            run.save()
            schedule_on_commit()
        else:
            token = run.issue_ingest_token()
            run.status, run.started_at = RunStatus.RUNNING, timezone.now()
            run.status_reason = f"reported by its own {run.framework} process"
            run.save()
    return run, token


def do_fork_run(user, parent: Run, checkpoint: Checkpoint, config: dict,
                priority: int = 0) -> Run:
    """A new run that starts from one of ``parent``'s checkpoints with ``config``. Raises
    Refused for a fork that cannot start or would train nothing (Run.fork_problem)."""
    if checkpoint.run_id != parent.pk:
        raise ValueError(f"checkpoint {checkpoint.pk} belongs to run {checkpoint.run_id}, "
                         f"not to run {parent.pk}")
    if not checkpoint.on_disk():
        raise Refused(f"run {parent.pk}'s checkpoint at step {checkpoint.step} is no longer "
                      f"on disk (a run keeps its last checkpoint.keep_last); fork from one "
                      "that is")
    if problem := parent.fork_problem(config, checkpoint.step):
        raise Refused(f"{problem[0]}: {problem[1]}", field=problem[0])
    refuse_unplaceable(config)
    with transaction.atomic():
        run = Run.objects.create(name=config.get("name") or parent.name, config=config,
                                 created_by=user, parent=parent,
                                 source_checkpoint=str(checkpoint.directory()),
                                 priority=priority)
        schedule_on_commit()
    return run


def do_stop_run(user, run: Run) -> None:
    """Ask the run's driver to checkpoint and exit. The flag is in the database, where the
    driver polls it, before any task runs; the task only stops the Ray job if the driver
    has not exited in time. A run still waiting in the queue is cancelled: it never
    starts. Raises InvalidTransition when the run cannot be stopped."""
    with transaction.atomic():
        if run.status == RunStatus.QUEUED:
            run.transition_to(RunStatus.STOPPED, f"cancelled in the queue by {user}")
            return
        run.request_stop(f"stop requested by {user}")
        transaction.on_commit(lambda: stop_run.delay(run.pk))


def do_request_control(user, run: Run, control: Control) -> RunControl:
    """Ask a running run's driver for a live control (validated: engine.controls); it
    polls it and applies it at the next step boundary. Raises Refused unless the run is
    being submitted or running, and ControlError when the control cannot apply to this
    run (check_control) or asks for more rollout workers than the cluster could ever
    hold."""
    with transaction.atomic():
        run.refresh_from_db(fields=["status"])
        if not run.accepts_controls:
            raise Refused(f"run {run.pk} is {run.status}; live controls need a running run")
        check_control(control, run.run_config)
        if control.kind == "set_rollout_workers" and \
                (why := resize_refusal(run, control.value)) is not None:
            raise ControlError([("value", why)])
        value = getattr(control, "value", None)
        row = RunControl.objects.create(run=run, kind=control.kind, requested_by=user,
                                        value=None if value is None else float(value))
        logger.info("run %s: control %s (%s) requested by %s", run.pk, row.pk, row.label, user)
    return row


def do_set_priority(user, run: Run, priority: int) -> None:
    """Change a queued run's place in the queue (higher starts first). Raises Refused
    when the run is no longer queued."""
    with transaction.atomic():
        if not Run.objects.filter(pk=run.pk, status=RunStatus.QUEUED).update(priority=priority):
            run.refresh_from_db(fields=["status"])
            raise Refused(f"run {run.pk} is {run.status}; only a queued run's priority "
                          "can change")
        run.priority = priority
        logger.info("run %s: priority %s set by %s", run.pk, priority, user)
        schedule_on_commit()


def do_archive_run(user, run: Run) -> None:
    """Take a finished run off the runs list. Raises Refused for a run that is not
    finished (stop it first)."""
    if not run.is_terminal:
        raise Refused(f"run {run.pk} is {run.status}; only a finished run can be archived "
                      "(stop it first)")
    if run.archived_at is None:
        run.archived_at = timezone.now()
        Run.objects.filter(pk=run.pk, archived_at=None).update(archived_at=run.archived_at)



def do_restore_run(user, run: Run) -> None:
    """Put an archived run back on the runs list."""
    run.archived_at = None
    Run.objects.filter(pk=run.pk).update(archived_at=None)
    logger.info("run %s: restored to the runs list by %s", run.pk, user)


def do_delete_run(user, run: Run) -> None:
    """Delete a finished run: its rows (events, metrics, spans, checkpoints, alerts,
    controls go with it) and, once that commits, its directory under the runs dir.
    Raises Refused for a run that is not finished (stop or cancel it first) and for one
    whose checkpoint a fork still waits to start from."""
    with transaction.atomic():
        locked = Run.objects.select_for_update().filter(pk=run.pk).first()
        if locked is None:
            raise Refused(f"run {run.pk} no longer exists")
        if not locked.is_terminal:
            raise Refused(f"run {run.pk} is {locked.status}; only a finished run can be "
                          "deleted (stop or cancel it first)")
        waiting = list(locked.forks.filter(status__in=[RunStatus.QUEUED, RunStatus.SUBMITTING])
                       .values_list("pk", flat=True))
        if waiting:
            raise Refused(f"run {run.pk}'s checkpoint is where fork(s) "
                          f"{', '.join(f'#{pk}' for pk in waiting)} will start from; cancel "
                          "them or let them start first")
        directory = run_directory(run.pk)
        locked.delete()
        transaction.on_commit(partial(remove_run_directory, directory))
    logger.info("run %s deleted by %s", run.pk, user)


def remove_run_directory(directory: Path) -> None:
    if directory.exists():
        shutil.rmtree(directory)
