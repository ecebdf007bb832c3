"""The Celery app: config from Django settings (CELERY_*), tasks from each app's tasks.py.

    celery -A controlplane worker     short tasks: submit_run, stop_run, enforce_stop
    celery -A controlplane beat       sync_runs, evaluate_alerts every 10 s (CELERY_BEAT_SCHEDULE)
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("controlplane")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
app.autodiscover_tasks(["jobs.alerts"])   # jobs/alerts/tasks.py: alert evaluation, delivery
