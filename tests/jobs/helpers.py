"""Events and requests for ingest tests; API tokens for the REST API's."""

import json

from django.conf import settings
from django.contrib.auth.models import Group, User

from engine.api import CheckpointEvent, LogEvent, MetricsEvent, RunStatusEvent, SpanEvent
from jobs.auth import OPERATOR_GROUP
from jobs.models import ApiToken, Checkpoint


def post_events(client, run, token, events, **extra):
    body = {"events": [e if isinstance(e, dict) else e.to_dict() for e in events]}
    return post_body(client, run.pk, json.dumps(body), token=token, **extra)


def post_body(client, run_id, body, token=None, **extra):
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return client.post(f"/api/runs/{run_id}/events", data=body,
                       content_type="application/json", headers=headers, **extra)


def metrics(seq, step, **values):
    return MetricsEvent(seq=seq, ts=1000.0 + seq, step=step, values=values)


def span(seq, step, device="cpu:0", phase="rollout"):
    return SpanEvent(seq=seq, ts=1000.0 + seq, device=device, phase=phase,
                     start=10.0 + step, end=10.5 + step, step=step, version=step)


def status(seq, value, message=""):
    return RunStatusEvent(seq=seq, ts=1000.0 + seq, status=value, message=message)


def log(seq, message="hello"):
    return LogEvent(seq=seq, ts=1000.0 + seq, message=message)


def checkpoint(seq, step, path="/ckpt"):
    return CheckpointEvent(seq=seq, ts=1000.0 + seq, step=step, version=step,
                           path=f"{path}/step_{step:06d}", fingerprint=f"fp{step}")


def api_token(username: str, operator: bool) -> str:
    """A new user's API token; an operator's when ``operator``."""
    user = User.objects.create_user(username)
    if operator:
        user.groups.add(Group.objects.get_or_create(name=OPERATOR_GROUP)[0])
    return ApiToken.issue(user, "test")[1]


def checkpoint_on_disk(run, step: int) -> Checkpoint:
    """A checkpoint row and its directory where the driver writes it (state.json marks a
    finished one), under settings.RLPLANE_RUNS_DIR."""
    d = settings.RLPLANE_RUNS_DIR / f"run-{run.pk}" / "checkpoints" / f"step_{step:06d}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "state.json").write_text("{}")
    return Checkpoint.objects.create(run=run, step=step, version=step, path=str(d))
