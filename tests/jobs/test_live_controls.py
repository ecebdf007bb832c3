"""Live controls on the control plane's side: requested from the REST API, the run page or
(tests/test_cli.py) the CLI; polled by the driver with the run's token; marked applied by
ingest, which also makes the badge say "paused" and the charts draw a mark."""

import json

import pytest
from django.contrib.auth.models import User

from engine.api import ControlAppliedEvent, WorkersResizedEvent
from jobs.consumers import run_update
from jobs.models import Run, RunControl, RunStatus
from jobs.models.controls import display_status
from jobs.queries.run_page import chart_data

from .helpers import api_token, post_events

pytestmark = pytest.mark.django_db

API = "/api/v1"


def applied(seq: int, control: RunControl, step: int, message: str = "done") -> dict:
    value = control.value if control.kind in ("set_lr", "set_eval_every") else None
    return ControlAppliedEvent(seq=seq, ts=1000.0 + seq, control_id=control.pk,
                               kind=control.kind, value=value, step=step,
                               requested_by="olga", message=f"{message} (by olga)").to_dict()


def post_control(client, run, token, body):
    return client.post(f"{API}/runs/{run.pk}/controls", json.dumps(body),
                       content_type="application/json",
                       headers={"Authorization": f"Bearer {token}"})


def poll(client, run, token, after=0):
    return client.get(f"/api/runs/{run.pk}/controls", {"after": after},
                      headers={"Authorization": f"Bearer {token}"})


@pytest.fixture
def operator_token() -> str:
    return api_token("olga", operator=True)


# --- REST --------------------------------------------------------------------------------

def test_an_operator_asks_for_controls_and_lists_them(client, run, operator_token):
    first = post_control(client, run, operator_token, {"kind": "set_lr", "value": 5e-5})
    second = post_control(client, run, operator_token, {"kind": "pause"})

    assert first.status_code == 201 and second.status_code == 201
    assert (first.json()["kind"], first.json()["value"], first.json()["requested_by"]) == (
        "set_lr", 5e-5, "olga")
    assert first.json()["applied_step"] is None
    listed = client.get(f"{API}/runs/{run.pk}/controls",
                        headers={"Authorization": f"Bearer {operator_token}"}).json()
    assert [c["kind"] for c in listed] == ["set_lr", "pause"]


def test_a_viewer_sees_the_controls_but_cannot_ask_for_one(client, run, operator_token):
    post_control(client, run, operator_token, {"kind": "checkpoint"})
    viewer = api_token("vic", operator=False)

    refused = post_control(client, run, viewer, {"kind": "pause"})

    assert refused.status_code == 403
    assert refused.json()["detail"] == "operators only: ask an admin to add you to 'operator'"
    assert list(RunControl.objects.values_list("kind", flat=True)) == ["checkpoint"]
    listed = client.get(f"{API}/runs/{run.pk}/controls",
                        headers={"Authorization": f"Bearer {viewer}"})
    assert listed.status_code == 200 and len(listed.json()) == 1


@pytest.mark.parametrize("body,field,words", [
    ({"kind": "set_lr", "value": 0}, "value", "greater than 0"),
    ({"kind": "set_lr", "value": -1e-4}, "value", "greater than 0"),
    ({"kind": "set_lr", "value": 3}, "value", "less than or equal to 1"),
    ({"kind": "set_lr"}, "value", "required"),
    ({"kind": "set_eval_every", "value": 2.5}, "value", "integer"),
    ({"kind": "set_eval_every", "value": -3}, "value", "greater than or equal to 0"),
    ({"kind": "set_eval_every", "value": "often"}, "value", "number"),
    ({"kind": "pause", "value": 1}, "value", "remove it"),
    ({"kind": "rewind"}, "kind", "not a valid choice"),
])
def test_a_bad_control_is_400_naming_the_field(client, run, operator_token, body, field,
                                               words):
    response = post_control(client, run, operator_token, body)

    assert response.status_code == 400, response.json()
    [error] = response.json()["errors"]
    assert error["field"] == field and words in error["message"], error
    assert not RunControl.objects.exists()


def test_a_run_that_is_not_running_takes_no_control(client, make_run, operator_token):
    for status in (RunStatus.QUEUED, RunStatus.STOPPING, RunStatus.SUCCEEDED):
        target = make_run(status)

        response = post_control(client, target, operator_token, {"kind": "checkpoint"})

        assert response.status_code == 409
        assert "live controls need a running run" in response.json()["detail"]
    assert not RunControl.objects.exists()


# --- the driver's poll and ingest ----------------------------------------------------------

def test_the_driver_polls_pending_controls_after_an_id_with_its_run_token(
        client, run, token, make_run, operator_token):
    ids = [post_control(client, run, operator_token, body).json()["id"]
           for body in ({"kind": "set_eval_every", "value": 10}, {"kind": "checkpoint"})]
    other_token = make_run(name="other").issue_ingest_token()

    answer = poll(client, run, token).json()
    assert answer == {"stop": False, "controls": [
        {"id": ids[0], "kind": "set_eval_every", "value": 10, "requested_by": "olga"},
        {"id": ids[1], "kind": "checkpoint", "requested_by": "olga"}]}
    assert [c["id"] for c in poll(client, run, token, after=ids[0]).json()["controls"]] == \
        [ids[1]]
    assert poll(client, run, other_token).status_code == 403
    assert poll(client, run, token, after="x").status_code == 400


def test_ingest_marks_a_control_applied_and_the_poll_leaves_it_out(
        client, run, token, operator_token):
    post_control(client, run, operator_token, {"kind": "set_lr", "value": 5e-5})
    control = RunControl.objects.get()

    assert post_events(client, run, token, [applied(1, control, step=4)]).status_code == 200

    control.refresh_from_db()
    assert (control.applied_step, control.message) == (4, "done (by olga)")
    assert control.applied_at is not None
    assert poll(client, run, token).json()["controls"] == []


def test_the_run_is_paused_between_an_applied_pause_and_resume(client, run, token,
                                                               operator_token):
    pause = RunControl.objects.create(run=run, kind="pause")
    resume = RunControl.objects.create(run=run, kind="resume")
    assert display_status(run) == "running"  # asked, not yet applied

    post_events(client, run, token, [applied(1, pause, step=3)])
    assert display_status(run) == "paused"
    detail = client.get(f"{API}/runs/{run.pk}",
                        headers={"Authorization": f"Bearer {operator_token}"}).json()
    assert detail["paused"] is True and detail["status"] == "running"

    post_events(client, run, token, [applied(2, resume, step=3)])
    assert display_status(run) == "running"
    Run.objects.filter(pk=run.pk).update(status=RunStatus.STOPPED)
    run.refresh_from_db()
    assert display_status(run) == "stopped"


# --- the run page --------------------------------------------------------------------------

def test_the_page_shows_paused_and_offers_resume_to_operators(operator, run, token):
    pause = RunControl.objects.create(run=run, kind="pause",
                                      requested_by=User.objects.get(username="operator"))
    operator.post(f"/api/runs/{run.pk}/events", json.dumps(
        {"events": [applied(1, pause, 3, "paused before step 3")]}),
        content_type="application/json", headers={"Authorization": f"Bearer {token}"})

    page = operator.get(f"/runs/{run.pk}").content.decode()

    assert 'class="badge badge-paused">paused</span>' in page
    assert 'id="control-pause" method="post"' in page and 'id="control-resume"' in page
    assert f'<form id="control-pause" method="post" action="/runs/{run.pk}/controls" hidden>' \
        in page
    assert "paused before step 3 (by olga)" in page          # the log names who
    assert "<td>operator</td><td>pause</td><td>step 3</td>" in page


def test_a_viewer_sees_no_control_buttons_and_cannot_post_one(client, run):
    viewer = User.objects.create_user("vic")
    client.force_login(viewer)

    page = client.get(f"/runs/{run.pk}").content.decode()
    response = client.post(f"/runs/{run.pk}/controls", {"kind": "pause"})

    assert 'id="live-controls"' not in page and "Checkpoint now" not in page
    assert response.status_code == 403 and not RunControl.objects.exists()


def test_an_operator_sends_controls_from_the_page_and_a_bad_value_is_named(operator, run):
    sent = operator.post(f"/runs/{run.pk}/controls", {"kind": "set_lr", "value": "2e-5"},
                         follow=True).content.decode()
    bad = operator.post(f"/runs/{run.pk}/controls", {"kind": "set_eval_every", "value": "-2"},
                        follow=True).content.decode()

    assert "Sent lr 2e-05" in sent
    assert "Not sent: value: Input should be greater than or equal to 0" in bad
    assert [(c.kind, c.value) for c in RunControl.objects.all()] == [("set_lr", 2e-5)]


def test_applied_controls_are_marked_on_the_charts_at_load_and_live(run):
    lr = RunControl.objects.create(run=run, kind="set_lr", value=5e-5, applied_step=7)
    RunControl.objects.filter(pk=lr.pk).update(applied_at="2026-01-01T00:00:00Z")
    RunControl.objects.create(run=run, kind="checkpoint")  # pending: no mark yet
    every = RunControl.objects.create(run=run, kind="set_eval_every", value=10)

    assert chart_data(run)["marks"] == [{"step": 7, "label": "lr 5e-05"}]
    update = run_update([applied(5, every, 9, "eval every 0 -> 10 steps")], None)
    assert update["marks"] == [{"step": 9, "label": "eval every 10"}]
    assert "eval every 0 -&gt; 10 steps (by olga)" in update["append"]["run-logs"]
    assert "log-control" in update["append"]["run-logs"]


# --- set_rollout_workers: only where the engine can resize ----------------------------------

ON_RAY = {"name": "t", "steps": 3, "weight_sync": {"type": "object_store"},
          "placement": {"type": "disaggregated", "rollout_workers": 1}}


@pytest.fixture
def ray_run(run) -> Run:
    Run.objects.filter(pk=run.pk).update(config=Run(config=ON_RAY).config)
    run.refresh_from_db()
    return run


@pytest.fixture
def four_gpus(monkeypatch):
    """Ray's answer (fetch_json, the seam): 4 logical GPUs in all."""
    from jobs.runs import queue

    monkeypatch.setattr(queue, "fetch_json", lambda path: {"data": {"clusterStatus": {
        "loadMetricsReport": {"usage": {"GPU": [2.0, 4.0]}}}}})


def test_a_run_on_ray_takes_a_new_worker_count_and_the_driver_polls_it(
        client, ray_run, operator_token, four_gpus):
    sent = post_control(client, ray_run, operator_token,
                        {"kind": "set_rollout_workers", "value": 3})

    assert sent.status_code == 201, sent.json()
    assert poll(client, ray_run, ray_run.issue_ingest_token()).json()["controls"] == [
        {"id": sent.json()["id"], "kind": "set_rollout_workers", "value": 3,
         "requested_by": "olga"}]


@pytest.mark.parametrize("value,words", [
    (4, "4 rollout workers with the rest of this run's placement ask for 5 GPUs and the "
        "Ray cluster has 4 in all; ask for fewer"),
    (0, "greater than or equal to 1"),
    (2.5, "integer"),
])
def test_a_worker_count_the_cluster_could_never_hold_or_out_of_bounds_is_400(
        client, ray_run, operator_token, four_gpus, value, words):
    response = post_control(client, ray_run, operator_token,
                            {"kind": "set_rollout_workers", "value": value})

    assert response.status_code == 400
    [error] = response.json()["errors"]
    assert error["field"] == "value" and words in error["message"], error
    assert not RunControl.objects.exists()


def test_an_in_process_run_is_refused_a_worker_count_naming_the_placement_to_launch_with(
        client, run, operator_token, operator):
    response = post_control(client, run, operator_token,
                            {"kind": "set_rollout_workers", "value": 2})
    page = operator.post(f"/runs/{run.pk}/controls",
                         {"kind": "set_rollout_workers", "value": "2"}, follow=True)

    assert response.status_code == 400
    [error] = response.json()["errors"]
    assert error["field"] == "kind" and "placement.ray = true" in error["message"]
    assert "Not sent: kind: set_rollout_workers resizes" in page.content.decode()
    assert 'id="control-workers"' not in page.content.decode()
    assert not RunControl.objects.exists()


def test_the_page_offers_the_worker_count_of_a_run_on_ray_from_its_latest_resize(
        operator, ray_run):
    assert 'placeholder="1" required' in operator.get(f"/runs/{ray_run.pk}").content.decode()

    post_events(operator, ray_run, ray_run.issue_ingest_token(), [WorkersResizedEvent(
        seq=1, ts=1001.0, step=2, previous=1, workers=2)])

    page = operator.get(f"/runs/{ray_run.pk}").content.decode()
    assert 'id="control-workers"' in page and 'placeholder="2" required' in page
    assert "<dt>rollout workers</dt><dd>2 (resized live)</dd>" in page
