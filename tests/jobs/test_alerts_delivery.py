"""Notification delivery to a real local HTTP receiver: exactly once with two workers
racing for it, retried on failure and then recorded; email through Django's backend."""

import threading
from datetime import timedelta

import pytest
from django.core import mail
from django.db import connection
from django.utils import timezone

from jobs.alerts.delivery import ATTEMPTS, deliver_notification, redeliver_notifications
from jobs.models import Alert, AlertChannel, Notification, NotificationStatus
from jobs.models.alerts import CLAIM_TTL

from ..webhook_receiver import Receiver

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def local_webhooks_allowed(settings):
    """The receivers here listen on loopback, which the webhook policy refuses unless
    RLPLANE_WEBHOOK_ALLOW names it (jobs.alerts.http)."""
    settings.RLPLANE_WEBHOOK_ALLOW = ["127.0.0.1"]


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def notification(run, kind: str, target: str) -> Notification:
    alert = Alert.objects.create(run=run, kind="WeightSyncDesync", dedup_key="WeightSyncDesync",
                                 cause="the generator is not receiving new weights",
                                 runbook="check the sync", step=3,
                                 evidence={"values": {"version_rollout": 1}})
    channel = AlertChannel.objects.create(name="c", kind=kind, target=target)
    return Notification.objects.create(alert=alert, channel=channel, event="open")


def test_two_racing_workers_deliver_the_webhook_exactly_once(run, receiver):
    n = notification(run, "webhook", receiver.url)
    start, results = threading.Barrier(2), []

    def worker():
        start.wait()
        try:
            results.append(deliver_notification(n.pk, backoff_s=0))
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert sorted(results) == ["claimed elsewhere", "sent"]
    [body] = receiver.bodies
    assert body["kind"] == "WeightSyncDesync" and body["event"] == "open"
    assert body["cause"] == "the generator is not receiving new weights"
    assert body["url"].endswith(f"/runs/{run.pk}#alert-{n.alert_id}")
    n.refresh_from_db()
    assert (n.status, n.attempts, n.error) == (NotificationStatus.SENT, 1, "")
    assert deliver_notification(n.pk) == "claimed elsewhere"       # a redelivered message


def test_a_failing_receiver_is_retried_then_recorded_as_failed(run, receiver):
    receiver.status = 503
    n = notification(run, "webhook", receiver.url)
    assert deliver_notification(n.pk, backoff_s=0) == "failed"
    assert len(receiver.bodies) == ATTEMPTS
    n.refresh_from_db()
    assert n.status == NotificationStatus.FAILED and n.attempts == ATTEMPTS
    assert "HTTP 503" in n.error


def test_a_refusing_receiver_is_a_permanent_failure_without_retries(run, receiver):
    receiver.status = 404
    n = notification(run, "webhook", receiver.url)
    assert deliver_notification(n.pk, backoff_s=0) == "failed"
    assert len(receiver.bodies) == 1
    n.refresh_from_db()
    assert "refused it: HTTP 404" in n.error


def test_an_unreachable_receiver_is_retried_then_recorded(run):
    closed = Receiver()
    closed.close()                                    # nothing listens on that port now
    n = notification(run, "webhook", closed.url)
    assert deliver_notification(n.pk, backoff_s=0) == "failed"
    n.refresh_from_db()
    assert n.attempts == ATTEMPTS and "127.0.0.1" in n.error


def test_email_goes_through_djangos_backend(run, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    n = notification(run, "email", "ops@example.com")
    assert deliver_notification(n.pk) == "sent"
    [message] = mail.outbox
    assert message.to == ["ops@example.com"] and "WeightSyncDesync" in message.subject
    assert "not receiving new weights" in message.body and "check the sync" in message.body


# --- the webhook target policy (issue 19 item 8) -----------------------------------------

@pytest.mark.parametrize("target, why", [
    ("file:///etc/passwd", "http:// or https://"),
    ("gopher://127.0.0.1:6379/_PING", "http:// or https://"),
    ("127.0.0.1:8000/hook", "http:// or https://"),
    ("http://localhost:9/hook", "non-public address"),
    ("http://10.1.2.3/hook", "non-public address"),
    ("http://169.254.169.254/latest/meta-data", "non-public address"),
    ("http://[::1]:9/hook", "non-public address"),
])
def test_a_target_the_policy_refuses_fails_at_once_and_sends_nothing(run, settings, target,
                                                                       why):
    settings.RLPLANE_WEBHOOK_ALLOW = []
    n = notification(run, "webhook", target)

    assert deliver_notification(n.pk, backoff_s=0) == "failed"
    n.refresh_from_db()
    assert n.attempts == 1 and why in n.error


def test_the_deny_list_wins_over_the_allow_list(run, receiver, settings):
    settings.RLPLANE_WEBHOOK_DENY = ["127.0.0.0/8"]
    n = notification(run, "webhook", receiver.url)

    assert deliver_notification(n.pk, backoff_s=0) == "failed"
    assert receiver.bodies == []
    n.refresh_from_db()
    assert "RLPLANE_WEBHOOK_DENY" in n.error


def test_a_redirect_is_not_followed(run, receiver):
    inner = Receiver()
    try:
        receiver.status = 302
        receiver.location = inner.url             # e.g. to an internal service
        n = notification(run, "webhook", receiver.url)

        assert deliver_notification(n.pk, backoff_s=0) == "failed"
        assert inner.bodies == [] and len(receiver.bodies) == 1
        n.refresh_from_db()
        assert "redirects are not followed" in n.error
    finally:
        inner.close()


def test_a_transport_that_raises_past_its_contract_is_recorded_not_left_pending(
        run, receiver, monkeypatch):
    from jobs.alerts import http

    def broken(url, payload, timeout_s=10.0):
        raise KeyError("surprise")

    monkeypatch.setattr(http, "post_json", broken)
    n = notification(run, "webhook", receiver.url)

    assert deliver_notification(n.pk, backoff_s=0) == "failed"
    n.refresh_from_db()
    assert n.status == NotificationStatus.FAILED and "KeyError" in n.error


def test_a_webhook_channel_with_a_non_http_target_does_not_validate():
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError, match="http:// or https://"):
        AlertChannel(name="x", kind="webhook", target="file:///etc/passwd").full_clean()
    AlertChannel(name="y", kind="webhook", target="https://hooks.example.com/x").full_clean()


# --- a sender that died after claiming (issue 19 item 12; the real-worker drill is in
# tests/e2e/test_worker_killed_after_claim.py) --------------------------------------------

def claimed_by_a_dead_worker(n: Notification, age) -> None:
    Notification.objects.filter(pk=n.pk).update(claimed_at=timezone.now() - age)


def test_a_claim_older_than_its_ttl_is_taken_over_and_sent_once(run, receiver):
    n = notification(run, "webhook", receiver.url)
    claimed_by_a_dead_worker(n, CLAIM_TTL + timedelta(seconds=1))

    assert list(Notification.undelivered()) == [n]
    assert deliver_notification(n.pk, backoff_s=0) == "sent"
    assert deliver_notification(n.pk, backoff_s=0) == "claimed elsewhere"
    assert len(receiver.bodies) == 1 and not Notification.undelivered().exists()


def test_a_live_senders_claim_is_left_alone(run, receiver):
    n = notification(run, "webhook", receiver.url)
    claimed_by_a_dead_worker(n, CLAIM_TTL - timedelta(seconds=30))

    assert not Notification.undelivered().exists()
    assert deliver_notification(n.pk, backoff_s=0) == "claimed elsewhere"
    assert receiver.bodies == []


def test_a_sender_whose_claim_was_taken_over_stops_before_its_next_attempt(
        run, receiver, monkeypatch):
    from jobs.alerts import http

    n = notification(run, "webhook", receiver.url)

    def failing_then_taken_over(url, payload, timeout_s=10.0):
        claimed_by_a_dead_worker(n, timedelta(0))   # another worker's fresh claim
        raise http.HttpError("no answer")

    monkeypatch.setattr(http, "post_json", failing_then_taken_over)

    assert deliver_notification(n.pk, backoff_s=0) == "claimed elsewhere"
    n.refresh_from_db()
    assert (n.status, n.attempts) == (NotificationStatus.PENDING, 1)


def test_a_notification_whose_task_was_lost_is_queued_again(run, receiver, monkeypatch):
    n = notification(run, "webhook", receiver.url)
    fresh = Notification.objects.create(alert=n.alert, channel=n.channel, event="resolved")
    Notification.objects.filter(pk=n.pk).update(created_at=timezone.now() - 2 * CLAIM_TTL)
    queued = []
    monkeypatch.setattr("jobs.alerts.delivery.deliver_notification.delay", queued.append)

    assert redeliver_notifications() == 1 and queued == [n.pk]
    assert fresh.pk not in queued
