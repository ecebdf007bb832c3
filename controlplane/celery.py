"""The Celery app: config from Django settings (CELERY_*), tasks from TASK_MODULES.

    celery -A controlplane worker     short tasks: submit_run, stop_run, enforce_stop
    celery -A controlplane beat       sync_runs, evaluate_alerts every 10 s (CELERY_BEAT_SCHEDULE)
"""

import os

from celery import Celery

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
