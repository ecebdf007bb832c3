"""Celery tasks of alerting: the rules on a clock. Sending is jobs/alerts/delivery.py.

    evaluate_alerts()           beat, every 10 s: the rules over each live run, so that
                                "nothing happened" conditions (PhaseHang, RunLost) fire

The rules after ingest, debounced per run, are jobs/alerts/debounce.py's task.
"""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.db import transaction
from django.utils import timezone

from jobs.alerts.lifecycle import do_evaluate_alerts
from jobs.models import LIVE, Run, RunStatus


@shared_task
def evaluate_alerts() -> None:
    """Live runs, and runs lost in the last hour (RunLost opens once for those)."""
    recent = timezone.now() - timedelta(hours=1)
    runs = Run.objects.filter(status__in=LIVE) | Run.objects.filter(
        status=RunStatus.LOST, finished_at__gte=recent)
    for run_id in runs.values_list("pk", flat=True):
        with transaction.atomic():
            run = Run.objects.select_for_update().get(pk=run_id)
            do_evaluate_alerts(run)
