"""Celery tasks of alerting.

    evaluate_alerts()           beat, every 10 s: the rules over each live run, so that
                                "nothing happened" conditions (PhaseHang, RunLost) fire
    deliver_notification(id)    claim (conditional update) -> transport, retried
    redeliver_notifications()   beat, every 30 s: queue again each notification whose
                                sender died or whose task was lost (Notification.undelivered)
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

from celery import shared_task
from django.db import transaction
from django.utils import timezone

from jobs.alerts.lifecycle import do_evaluate_alerts
from jobs.alerts.transports import TRANSPORTS, TransportError
from jobs.models import LIVE, Notification, NotificationStatus, Run, RunStatus

logger = logging.getLogger(__name__)

ATTEMPTS = 3
BACKOFF_S = 1.0      # doubles after each failed attempt


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


@shared_task
def deliver_notification(notification_id: int, backoff_s: float = BACKOFF_S) -> str:
    """Send one notification, at most once: only the worker whose claim succeeds sends.
    Transient failures are retried (ATTEMPTS in all); the outcome is recorded."""
    n = Notification.objects.select_related("alert__run", "channel").get(pk=notification_id)
    if not n.claim():
        return "claimed elsewhere"
    transport = TRANSPORTS[n.channel.kind]()
    error = ""
    for attempt in range(1, ATTEMPTS + 1):
        if not n.renew_claim():
            return "claimed elsewhere"   # this worker stalled past CLAIM_TTL
        try:
            try:
                transport.notify(n)
            except TransportError:
                raise
            except Exception as exc:   # a transport's bug must not leave it claimed, pending
                logger.exception("notification %s: the %s transport failed", n.pk,
                                 n.channel.kind)
                raise TransportError(f"{type(exc).__name__}: {exc}", permanent=True) from None
        except TransportError as exc:
            error = str(exc)
            logger.warning("notification %s attempt %s: %s", n.pk, attempt, exc)
            Notification.objects.filter(pk=n.pk).update(attempts=attempt, error=error)
            if exc.permanent:
                break
            if attempt < ATTEMPTS:
                time.sleep(backoff_s * 2 ** (attempt - 1))
            continue
        Notification.objects.filter(pk=n.pk).update(
            attempts=attempt, error="", status=NotificationStatus.SENT, sent_at=timezone.now())
        return "sent"
    Notification.objects.filter(pk=n.pk).update(status=NotificationStatus.FAILED, error=error)
    return "failed"


@shared_task
def redeliver_notifications() -> int:
    """Queue each undelivered notification again; the claim keeps it sent once."""
    ids = list(Notification.undelivered().values_list("pk", flat=True))
    for pk in ids:
        deliver_notification.delay(pk)
    return len(ids)
