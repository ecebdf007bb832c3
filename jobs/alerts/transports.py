"""Where a notification goes. One contract per transport, after healthchecks:
``notify(notification)`` returns None on success, raises TransportError on failure
(``permanent=True``: retrying cannot help).

    webhook   JSON POST of the alert; 5xx / no answer -> retry, 3xx (redirects are not
              followed), 4xx, a target the policy refuses (jobs.alerts.http) -> permanent
    email     Django's email backend (EMAIL_* settings)
"""

from __future__ import annotations

from django.conf import settings
from django.core.mail import send_mail

from jobs.alerts import http
from jobs.models import Notification


class TransportError(Exception):
    def __init__(self, message: str, permanent: bool = False):
        super().__init__(message)
        self.permanent = permanent


def payload(n: Notification) -> dict:
    a = n.alert
    return {"event": n.event, "alert_id": a.pk, "run_id": a.run_id, "run": a.run.name,
            "kind": a.kind, "state": a.state, "cause": a.cause, "runbook": a.runbook,
            "step": a.step, "evidence": a.evidence.get("values", {}),
            "url": f"{settings.RLPLANE_URL.rstrip('/')}/runs/{a.run_id}#alert-{a.pk}"}


class Webhook:
    def notify(self, n: Notification) -> None:
        try:
            status = http.post_json(n.channel.target, payload(n))
        except http.TargetRefused as exc:
            raise TransportError(str(exc), permanent=True) from None
        except http.HttpError as exc:
            raise TransportError(str(exc)) from None
        if 300 <= status < 400:
            raise TransportError(f"the receiver redirected: HTTP {status}; redirects are not "
                                 "followed, give the final URL", permanent=True)
        if 400 <= status < 500:
            raise TransportError(f"the receiver refused it: HTTP {status}", permanent=True)
        if status >= 500:
            raise TransportError(f"the receiver failed: HTTP {status}")


class Email:
    def notify(self, n: Notification) -> None:
        p = payload(n)
        subject = f"[rlplane] {p['kind']} {n.event}: run {p['run']} (#{p['run_id']})"
        body = f"{p['cause']}\n\nWhat to check: {p['runbook']}\n\nStep {p['step']}: {p['url']}\n"
        try:
            send_mail(subject, body, None, [n.channel.target])
        except OSError as exc:                   # smtplib errors are OSErrors
            raise TransportError(f"email to {n.channel.target}: {exc}") from None


TRANSPORTS = {"webhook": Webhook, "email": Email}
