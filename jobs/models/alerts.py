"""Alerts as rows, after healthchecks' Flip -> Notification.

    Alert          one condition on one run: open -> acknowledged -> resolved
                   (at most one unresolved alert per (run, dedup_key): repeats collapse)
    AlertChannel   where notifications go: a webhook URL or an email address
    Notification   one alert state change for one channel; a worker claims it with a
                   conditional update, so it is sent at most once, and records the outcome.
                   A claim lasts CLAIM_TTL and the sender renews it before each attempt:
                   a worker killed after claiming leaves a claim that expires, and the
                   beat's redeliver_notifications hands the notification to a new worker.

Every state change is one conditional UPDATE, so two workers (or an operator racing the
auto-resolver) cannot both win.
"""

from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.utils import timezone


class AlertState(models.TextChoices):
    OPEN = "open"
    ACKNOWLEDGED = "acknowledged"
    RESOLVED = "resolved"


LIVE_STATES = (AlertState.OPEN, AlertState.ACKNOWLEDGED)


class Alert(models.Model):
    run = models.ForeignKey("jobs.Run", on_delete=models.CASCADE, related_name="alerts")
    kind = models.CharField(max_length=40, db_index=True)
    dedup_key = models.CharField(max_length=100)
    state = models.CharField(max_length=16, choices=AlertState.choices,
                             default=AlertState.OPEN, db_index=True)
    cause = models.TextField()
    runbook = models.TextField()
    evidence = models.JSONField(default=dict)  # {"values": {...}, "series": {name, steps, values}}
    step = models.BigIntegerField(null=True)       # where it first fired
    last_step = models.BigIntegerField(null=True)  # where it last held
    opened_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                        on_delete=models.SET_NULL, related_name="+")
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                    on_delete=models.SET_NULL, related_name="+")
    resolved_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["-opened_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["run", "dedup_key"],
                                    condition=~Q(state=AlertState.RESOLVED),
                                    name="alert_one_unresolved_per_key"),
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} {self.kind} ({self.state})"

    def _move(self, sources, **changes) -> bool:
        if Alert.objects.filter(pk=self.pk, state__in=sources).update(**changes) != 1:
            self.refresh_from_db()
            return False
        for name, value in changes.items():
            setattr(self, name, value)
        return True

    def acknowledge(self, user) -> bool:
        """open -> acknowledged; False when it was not open (any more)."""
        return self._move([AlertState.OPEN], state=AlertState.ACKNOWLEDGED,
                          acknowledged_at=timezone.now(), acknowledged_by=user)

    def resolve(self, user=None, reason: str = "") -> bool:
        """open | acknowledged -> resolved; False when it already was."""
        return self._move(LIVE_STATES, state=AlertState.RESOLVED, resolved_at=timezone.now(),
                          resolved_by=user, resolved_reason=reason)


class AlertChannel(models.Model):
    class Kind(models.TextChoices):
        WEBHOOK = "webhook"
        EMAIL = "email"

    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    target = models.CharField(max_length=500, help_text="webhook URL or email address")
    enabled = models.BooleanField(default=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.kind} {self.target})"

    def clean(self) -> None:
        from jobs.alerts.http import TargetRefused, check_syntax

        if self.kind == self.Kind.WEBHOOK:
            try:
                check_syntax(self.target)
            except TargetRefused as exc:
                raise ValidationError({"target": str(exc)}) from None


# Longer than one delivery attempt (jobs.alerts.http's 10 s timeout, plus the backoff
# before it), since the sender renews its claim before each attempt: a live sender's
# claim never expires under it, a dead one's does.
CLAIM_TTL = timedelta(minutes=2)


class NotificationStatus(models.TextChoices):
    PENDING = "pending"
    SENT = "sent"
    FAILED = "failed"


class Notification(models.Model):
    alert = models.ForeignKey(Alert, on_delete=models.CASCADE, related_name="notifications")
    channel = models.ForeignKey(AlertChannel, on_delete=models.CASCADE,
                                related_name="notifications")
    event = models.CharField(max_length=16)   # the alert state it announces: open, resolved
    created_at = models.DateTimeField(default=timezone.now)
    claimed_at = models.DateTimeField(null=True, blank=True)  # set once, by the sender
    status = models.CharField(max_length=16, choices=NotificationStatus.choices,
                              default=NotificationStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.alert} {self.event} -> {self.channel} ({self.status})"

    def claim(self) -> bool:
        """True for exactly one caller: the worker that will send it. A pending
        notification whose claim expired (its sender died) can be claimed again."""
        now = timezone.now()
        unclaimed = Q(claimed_at=None) | Q(claimed_at__lt=now - CLAIM_TTL)
        claimable = Notification.objects.filter(unclaimed, pk=self.pk,
                                                status=NotificationStatus.PENDING)
        if claimable.update(claimed_at=now) != 1:
            return False
        self.claimed_at = now
        return True

    def renew_claim(self) -> bool:
        """Extend this sender's claim; False when it expired and another worker took it."""
        now = timezone.now()
        if Notification.objects.filter(pk=self.pk, claimed_at=self.claimed_at).update(
                claimed_at=now) != 1:
            return False
        self.claimed_at = now
        return True

    @classmethod
    def undelivered(cls):
        """Pending notifications that no live worker holds: claimed by a worker that
        died (the claim expired), or queued CLAIM_TTL ago and never claimed (the task
        message was lost, e.g. with the broker)."""
        before = timezone.now() - CLAIM_TTL
        return cls.objects.filter(
            Q(claimed_at__lt=before) | Q(claimed_at=None, created_at__lt=before),
            status=NotificationStatus.PENDING)
