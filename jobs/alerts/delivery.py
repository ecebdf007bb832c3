"""Sending an alert's notifications (Celery tasks), each at most once.

    deliver_notification(id)    claim (conditional update) -> transport, retried
    redeliver_notifications()   beat, every 30 s: queue again each notification whose
                                sender died or whose task was lost (Notification.undelivered)

The alert lifecycle (jobs/alerts/lifecycle.py) queues deliver_notification on commit.
"""

from __future__ import annotations

import logging
import time

from celery import shared_task
from django.utils import timezone

from jobs.alerts.transports import TRANSPORTS, TransportError
from jobs.models import Notification, NotificationStatus

logger = logging.getLogger(__name__)

ATTEMPTS = 3
BACKOFF_S = 1.0      # doubles after each failed attempt


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
