import uuid

import pytest
from channels.layers import get_channel_layer
from django.contrib.auth.models import Group
from django.test import Client

from jobs.auth import OPERATOR_GROUP
from jobs.models import Run, RunStatus
from jobs.runs import submit, tasks

CONFIG = {"name": "t", "steps": 3}


@pytest.fixture(autouse=True)
def runs_dir(settings, tmp_path):
    """Run directories (checkpoints a fork starts from) live under a fresh folder."""
    settings.RLPLANE_RUNS_DIR = tmp_path / "runs"
    return settings.RLPLANE_RUNS_DIR


@pytest.fixture
def make_run(db):
    def make(status: str = RunStatus.RUNNING, **fields) -> Run:
        run = Run.objects.create(name=fields.pop("name", "test run"), config=CONFIG, **fields)
        # Setup puts the run straight into the state a test starts from.
        Run.objects.filter(pk=run.pk).update(status=status)
        run.refresh_from_db()
        return run

    return make


@pytest.fixture
def operator(client, django_user_model):
    """The test client, logged in as a member of the operator group."""
    user = django_user_model.objects.create_user("operator")
    user.groups.add(Group.objects.get_or_create(name=OPERATOR_GROUP)[0])
    client.force_login(user)
    return client


@pytest.fixture
def run(make_run) -> Run:
    return make_run()


@pytest.fixture
def token(run) -> str:
    return run.issue_ingest_token()


@pytest.fixture
def channel_layer(settings):
    """The real Redis channel layer (settings'), under a prefix of its own so that concurrent test
    runs on the same Redis (run ids repeat) never see each other's messages."""
    layer = settings.CHANNEL_LAYERS["default"]
    settings.CHANNEL_LAYERS = {"default": {**layer, "CONFIG": {
        **layer["CONFIG"], "prefix": f"test-{uuid.uuid4().hex}"}}}
    return get_channel_layer()


@pytest.fixture
def queued(monkeypatch):
    """The Celery tasks the actions queue on commit: recorded here, never sent."""
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(submit.submit_run, "delay", lambda run_id: calls.append(("submit", run_id)))
    monkeypatch.setattr(tasks.stop_run, "delay", lambda run_id: calls.append(("stop", run_id)))
    return calls


@pytest.fixture
def session_cookie(django_user_model):
    """A logged-in viewer's session, as the Cookie header a websocket opens with."""
    user = django_user_model.objects.create_user("viewer")
    client = Client()
    client.force_login(user)
    return (b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())
