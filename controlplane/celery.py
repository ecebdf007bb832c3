"""The Celery app: config from Django settings (CELERY_*), tasks from TASK_MODULES.

    celery -A controlplane worker     short tasks: submit_run, stop_run, enforce_stop
    celery -A controlplane beat       sync_runs, evaluate_alerts every 10 s (CELERY_BEAT_SCHEDULE)
"""

import os

from celery import Celery
from celery.signals import task_postrun, task_prerun

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

# Every module that defines tasks, named here so that a worker knows them all at start.
TASK_MODULES = [
    "jobs.runs.submit",        # submit_run
    "jobs.runs.tasks",         # sync_runs, stop_run, enforce_stop
    "jobs.alerts.tasks",       # evaluate_alerts
    "jobs.alerts.debounce",    # evaluate_run_alerts (after ingest, debounced per run)
    "jobs.alerts.delivery",    # deliver_notification, redeliver_notifications
    "jobs.rollups",            # drop_expired_points (raw points past their retention)
]

app = Celery("controlplane", include=TASK_MODULES)
app.config_from_object("django.conf:settings", namespace="CELERY")


def in_worker(task) -> bool:
    """Not a task run eagerly, in its caller's process (and maybe its transaction)."""
    return task is not None and not getattr(task.request, "is_eager", False)


@task_prerun.connect
def close_old_db_connections(task=None, **kwargs) -> None:
    """A task starts as a request does: a connection past CONN_MAX_AGE, or one that saw an
    error and no longer answers, is closed (the next query opens another); one that is
    kept is health-checked at its first use (CONN_HEALTH_CHECKS)."""
    if in_worker(task):
        from django.db import close_old_connections

        close_old_connections()


@task_postrun.connect
def close_db_connections_after_a_failure(task=None, state=None, **kwargs) -> None:
    """A task that raised may have left its connection mid-query or mid-transaction (the
    case Celery closes every connection for): close it."""
    if in_worker(task) and state != "SUCCESS":
        from django.db import connections

        connections.close_all()
