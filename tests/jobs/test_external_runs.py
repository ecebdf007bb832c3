"""External runs (issue 29): a run another framework trains, created over the REST API,
reporting through the ingest door with its own token, shown on the pages, and refused
clearly wherever an rlplane RunConfig is needed (fork, planner)."""

import html
import json

import pytest

from engine.api import MetricsEvent, RunStatusEvent
from engine.api import metrics as M
from jobs.models import MetricPoint, Run, RunStatus
from jobs.runs.queue import do_schedule_runs

from .helpers import api_token

pytestmark = pytest.mark.django_db

API = "/api/v1"
TRL_RUN = {"name": "trl-grpo", "framework": "trl",
           "params": {"learning_rate": 1e-6, "max_steps": 40, "temperature": 0.7}}


def post(client, path, body, token):
    return client.post(API + path, json.dumps(body), content_type="application/json",
                       headers={"Authorization": f"Bearer {token}"})


@pytest.fixture
def created(client, django_capture_on_commit_callbacks, queued):
    """An external TRL run created by an operator's API token: (run, its ingest token)."""
    with django_capture_on_commit_callbacks(execute=True):
        response = post(client, "/runs/external", {"config": TRL_RUN},
                        api_token("olga", operator=True))
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["run"]["framework"] == "trl" and body["run"]["status"] == "running"
    assert body["ingest_url"].startswith("http")
    return Run.objects.get(pk=body["run"]["id"]), body["token"]


def ingest(client, run, token, events):
    return client.post(f"/api/runs/{run.pk}/events",
                       json.dumps({"events": [e.to_dict() for e in events]}),
                       content_type="application/json",
                       headers={"Authorization": f"Bearer {token}"})


def test_an_external_run_reports_with_its_own_token_and_ends_on_its_status(client, created):
    run, token = created
    events = [MetricsEvent(seq=i, ts=1e9 + i, step=i, values={"reward": 0.5, "my/own": 1.0})
              for i in range(1, 4)]
    events.append(RunStatusEvent(seq=4, ts=1e9 + 4, status="succeeded", message="done"))

    assert ingest(client, run, token, events).status_code == 200
    assert ingest(client, run, "not-the-token", events[:1]).status_code == 403

    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED and run.is_external
    # TRL's "reward" is stored as rlplane's reward/mean; a name no table maps is kept
    names = set(MetricPoint.objects.filter(run=run).values_list("name", flat=True))
    assert names == {M.REWARD_MEAN, "my/own"}


def test_the_run_page_shows_the_framework_and_its_params(operator, created):
    run, _ = created
    page = operator.get(f"/runs/{run.pk}")

    assert page.status_code == 200
    text = html.unescape(page.content.decode())
    assert "TRL" in text and "learning_rate" in text and 'framework = "trl"' in text
    assert "of 40" in text  # the total comes from the run's own max_steps


def test_a_fork_of_an_external_run_says_why_not(client, operator, created):
    run, _ = created
    response = post(client, f"/runs/{run.pk}/fork", {}, api_token("otto", operator=True))
    page = operator.get(f"/runs/{run.pk}/fork")

    assert response.status_code == 409 and "trl run" in response.json()["detail"]
    assert page.status_code == 409 and b"has no rlplane run config" in page.content


def test_the_queue_admits_around_an_external_run(created, make_run):
    """A live external run takes no slot (its process runs elsewhere): the queue neither
    fails on it nor counts it."""
    waiting = make_run(status=RunStatus.QUEUED)

    assert do_schedule_runs() == [waiting.pk]


@pytest.mark.parametrize("config, field", [
    ({"framework": "keras", "name": "x"}, "framework"),
    ({"framework": "verl", "name": "x", "launch": {"entrypoint": ""}}, "launch.entrypoint"),
    ({"framework": "verl", "name": "x", "launch": {"entrypoint": "python t.py",
                                                   "env": {"RLPLANE_TOKEN": "x"}}},
     "launch.env"),
    ({"framework": "script", "name": "x", "bogus": 1}, "bogus"),
])
def test_a_bad_external_config_names_the_field(client, config, field):
    response = post(client, "/runs/external", {"config": config},
                    api_token("olga", operator=True))

    assert response.status_code == 400
    assert field in [e["field"] for e in response.json()["errors"]]
    assert not Run.objects.exists()


def test_an_external_config_sent_as_a_native_launch_points_to_the_right_door(client):
    response = post(client, "/runs", {"config": TRL_RUN}, api_token("olga", operator=True))

    assert response.status_code == 400 and "/runs/external" in response.content.decode()


def test_a_viewer_cannot_create_an_external_run(client):
    response = post(client, "/runs/external", {"config": TRL_RUN}, api_token("vic", operator=False))

    assert response.status_code == 403 and not Run.objects.exists()


def test_a_tracked_run_whose_process_never_answers_a_stop_stops_being_watched(created):
    """No Ray job to stop: after the stop timeout the run is stopped, saying why, instead
    of staying "stopping" for good."""
    from jobs.runs import tasks

    run, _ = created
    run.request_stop("stop requested by olga")
    tasks.enforce_stop(run.pk)

    run.refresh_from_db()
    assert run.status == RunStatus.STOPPED and "did not report stopping" in run.status_reason


def test_a_launch_may_set_rlplane_variables_other_than_the_injected_ones():
    from engine.config import validate_external

    cfg = validate_external({"framework": "script", "launch": {
        "entrypoint": "python t.py", "env": {"RLPLANE_SPOOL_DIR": "/tmp/spool"}}})

    assert cfg.launch.env == {"RLPLANE_SPOOL_DIR": "/tmp/spool"}
