"""The REST API under /api/v1/: every endpoint, with a user's API token, the pages' role
rules (a viewer's token reads and nothing more) and JSON errors that name the field."""

import json

import pytest
from django.contrib.auth.models import User

from engine.config import ConfigError, validate_config
from jobs.cluster import status as cluster
from jobs.models import (
    Alert,
    AlertState,
    ApiToken,
    Checkpoint,
    MetricPoint,
    Preset,
    Run,
    RunEvent,
    RunStatus,
)
from jobs.runs.forms import RunConfigForm

from .helpers import api_token, checkpoint_on_disk

pytestmark = pytest.mark.django_db

API = "/api/v1"
GOOD_TOML = 'name = "api-run"\nsteps = 5\n[warm_start]\nsteps = 0\n'
BAD_TOML = 'name = "bad"\n[rollout]\ntemperature = 9\n[placement]\ndevices = 0\n'


@pytest.fixture
def operator_token() -> str:
    return api_token("olga", operator=True)


@pytest.fixture
def viewer_token() -> str:
    return api_token("vic", operator=False)


def call(client, method: str, path: str, token: str | None, body=None, **params):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if method == "get":
        return client.get(API + path, params, headers=headers)
    return client.post(API + path, json.dumps(body or {}), content_type="application/json",
                       headers=headers)


@pytest.fixture
def api(client, operator_token, django_capture_on_commit_callbacks, queued):
    """Call the API as the operator; on-commit work (the queue) runs."""
    def go(method, path, body=None, token=operator_token, **params):
        with django_capture_on_commit_callbacks(execute=True):
            return call(client, method, path, token, body, **params)
    return go


# --- auth and roles --------------------------------------------------------------------------

def test_a_request_without_a_token_is_401_in_json(client):
    response = client.get(f"{API}/runs")

    assert response.status_code == 401 and response["WWW-Authenticate"] == "Bearer"
    assert "detail" in response.json()


def test_a_revoked_or_unknown_token_is_refused(client, operator_token):
    ApiToken.objects.get().revoke()

    for token in (operator_token, "rlp_not-a-token"):
        response = call(client, "get", "/runs", token)
        assert response.status_code == 401
        assert "unknown or revoked" in response.json()["detail"]


def test_tokens_are_stored_hashed_and_remember_their_last_use(client, operator_token):
    row = ApiToken.objects.get()
    assert operator_token not in (row.token_hash, row.hint) and row.last_used_at is None

    call(client, "get", "/runs", operator_token)

    row.refresh_from_db()
    assert row.last_used_at is not None


@pytest.fixture
def targets(make_run):
    """One of each thing a write endpoint acts on."""
    parent = make_run(RunStatus.SUCCEEDED)
    checkpoint_on_disk(parent, 4)
    alert = Alert.objects.create(run=make_run(), kind="BubbleHigh", dedup_key="bubble",
                                 cause="idle", runbook="check")
    return {"running": make_run(), "queued": make_run(RunStatus.QUEUED), "parent": parent,
            "alert": alert}


WRITES = [
    ("launch", lambda t: ("/runs", {"toml": GOOD_TOML})),
    ("stop", lambda t: (f"/runs/{t['running'].pk}/stop", {})),
    ("fork", lambda t: (f"/runs/{t['parent'].pk}/fork", {})),
    ("archive", lambda t: (f"/runs/{t['parent'].pk}/archive", {})),
    ("priority", lambda t: (f"/runs/{t['queued'].pk}/priority", {"priority": 5})),
    ("baseline", lambda t: (f"/runs/{t['queued'].pk}/baseline", {"baseline_run": None})),
    ("acknowledge", lambda t: (f"/alerts/{t['alert'].pk}/acknowledge", {})),
    ("resolve", lambda t: (f"/alerts/{t['alert'].pk}/resolve", {})),
    ("control", lambda t: (f"/runs/{t['running'].pk}/controls", {"kind": "pause"})),
]


@pytest.mark.parametrize("name,target", WRITES, ids=[w[0] for w in WRITES])
def test_a_viewer_token_reads_but_cannot_change_anything(api, viewer_token, targets, name,
                                                         target):
    path, body = target(targets)
    before = (Run.objects.count(), sorted(Run.objects.values_list("status", "priority",
                                                                  "archived_at")),
              targets["alert"].state)

    response = api("post", path, body, token=viewer_token)

    assert response.status_code == 403
    assert response.json()["detail"] == "operators only: ask an admin to add you to 'operator'"
    targets["alert"].refresh_from_db()
    assert before == (Run.objects.count(), sorted(Run.objects.values_list(
        "status", "priority", "archived_at")), targets["alert"].state)
    assert api("get", "/runs", token=viewer_token).status_code == 200


# --- runs ------------------------------------------------------------------------------------

def test_launch_from_toml_queues_the_run_and_the_queue_submits_it(api, queued):
    response = api("post", "/runs", {"toml": GOOD_TOML, "priority": 3})

    assert response.status_code == 201
    body = response.json()
    run = Run.objects.get(pk=body["id"])
    assert (run.name, run.priority, run.created_by.username) == ("api-run", 3, "olga")
    assert body["config"]["steps"] == 5 and run.config["warm_start"]["steps"] == 0
    # The queue admitted it once the row committed: a free run slot, then submit_run.
    assert run.status == RunStatus.SUBMITTING and queued == [("submit", run.pk)]


def test_a_placement_the_cluster_could_never_hold_is_refused_naming_what_is_missing(
        api, queued, monkeypatch):
    monkeypatch.setattr("jobs.runs.queue.ray_capacity", lambda: ({"CPU": 4.0}, {"CPU": 0.0}))
    config = {"name": "big", "placement": {"type": "disaggregated", "rollout_workers": 1,
                                           "learner_devices": 1},
              "weight_sync": {"type": "shm"}}

    refused = api("post", "/runs", {"config": config})

    assert refused.status_code == 409, refused.json()
    assert "asks for 2 GPUs and the Ray cluster has 0 in all" in refused.json()["detail"]
    assert Run.objects.count() == 0 and queued == []


def test_launch_from_json_takes_the_same_config(api):
    response = api("post", "/runs", {"config": {"name": "json-run", "steps": 7}})

    assert response.status_code == 201
    assert Run.objects.get(pk=response.json()["id"]).config["steps"] == 7


def test_a_bad_config_is_400_with_each_field_path_and_the_forms_message(api, queued):
    response = api("post", "/runs", {"toml": BAD_TOML})

    assert response.status_code == 400
    errors = {e["field"]: e["message"] for e in response.json()["errors"]}
    form = RunConfigForm({"config": BAD_TOML, "placement": "colocated", "async_policy": "sync"})
    assert not form.is_valid()
    assert errors == {p.path: p.message for p in form.config_errors}  # the same paths, messages
    assert "(got 9)" in errors["rollout.temperature"]
    assert Run.objects.count() == 0 and queued == []


@pytest.mark.parametrize("body,field", [
    ({"toml": "steps = = 3"}, "(toml)"),
    ({"config": {"steps": "many"}}, "steps"),
    ({}, "toml"),
    ({"toml": GOOD_TOML, "config": {}}, "toml"),
    ({"toml": GOOD_TOML, "priority": "high"}, "priority"),
])
def test_bad_input_names_the_field(api, body, field):
    response = api("post", "/runs", body)

    assert response.status_code == 400
    assert field in [e["field"] for e in response.json()["errors"]]


def test_a_check_across_sections_is_400_at_the_path_it_names(api):
    response = api("post", "/runs", {"config": {"rollout": {"max_new_tokens": 1}}})

    assert response.status_code == 400
    [error] = response.json()["errors"]
    assert error["field"] == "rollout.max_new_tokens"
    assert "set it to >= " in error["message"]


def test_the_json_config_errors_are_the_engines(api):
    response = api("post", "/runs", {"config": {"steps": "many"}})

    with pytest.raises(ConfigError) as exc:
        validate_config({"steps": "many"})
    assert [(e["field"], e["message"]) for e in response.json()["errors"]] == exc.value.errors


def test_the_list_filters_by_status_and_name_and_leaves_archived_runs_out(api, make_run):
    running = make_run(name="alpha one")
    done = make_run(RunStatus.SUCCEEDED, name="beta")
    archived = make_run(RunStatus.FAILED, name="alpha old")
    api("post", f"/runs/{archived.pk}/archive")

    def ids(**params):
        return [r["id"] for r in api("get", "/runs", **params).json()]

    assert set(ids()) == {running.pk, done.pk}
    assert ids(status="succeeded") == [done.pk]
    assert set(ids(status="running,succeeded")) == {running.pk, done.pk}
    assert ids(name="alpha") == [running.pk]
    assert set(ids(name="alpha", archived="1")) == {running.pk, archived.pk}
    bad = api("get", "/runs", status="sleeping")
    assert bad.status_code == 400 and bad.json()["errors"][0]["field"] == "status"


def test_the_detail_carries_the_latest_metrics_and_the_open_alerts(api, make_run):
    run = make_run()
    MetricPoint.objects.bulk_create([
        MetricPoint(run=run, step=s, name="reward/mean", value=s / 10) for s in range(5)] + [
        MetricPoint(run=run, step=0, name="eval/reward_mean", value=0.25)])
    open_alert = Alert.objects.create(run=run, kind="BubbleHigh", dedup_key="b", cause="idle",
                                      runbook="r")
    Alert.objects.create(run=run, kind="StuckReward", dedup_key="s", cause="stuck",
                         runbook="r", state=AlertState.RESOLVED)

    body = api("get", f"/runs/{run.pk}").json()

    assert body["latest"]["reward/mean"] == {"step": 4, "value": 0.4}
    assert body["latest"]["eval/reward_mean"] == {"step": 0, "value": 0.25}
    assert [a["id"] for a in body["open_alerts"]] == [open_alert.pk]
    assert api("get", "/runs/999999").status_code == 404


def test_stop_asks_a_running_run_to_stop_and_cancels_a_queued_one(api, make_run, queued):
    running, waiting, done = make_run(), make_run(RunStatus.QUEUED), make_run(
        RunStatus.SUCCEEDED)

    assert api("post", f"/runs/{running.pk}/stop").json()["status"] == RunStatus.STOPPING
    cancelled = api("post", f"/runs/{waiting.pk}/stop").json()
    refused = api("post", f"/runs/{done.pk}/stop")

    assert ("stop", running.pk) in queued and ("stop", waiting.pk) not in queued
    assert cancelled["status"] == RunStatus.STOPPED and "cancelled" in cancelled["status_reason"]
    assert refused.status_code == 409 and "final" in refused.json()["detail"]


def test_fork_starts_from_the_latest_checkpoint_or_the_one_named(api, make_run, queued):
    parent = make_run(RunStatus.STOPPED, name="parent")
    first, last = checkpoint_on_disk(parent, 2), checkpoint_on_disk(parent, 4)

    latest = api("post", f"/runs/{parent.pk}/fork").json()
    chosen = api("post", f"/runs/{parent.pk}/fork",
                 {"checkpoint": first.pk, "config": {"name": "other", "steps": 9}}).json()

    assert (latest["parent"], latest["source_checkpoint"]) == (parent.pk, last.path)
    assert latest["config"]["name"] == "t-fork"
    assert (chosen["source_checkpoint"], chosen["config"]["steps"]) == (first.path, 9)
    elsewhere = api("post", f"/runs/{make_run().pk}/fork", {"checkpoint": first.pk})
    assert elsewhere.status_code == 400 and elsewhere.json()["errors"][0]["field"] == "checkpoint"


def test_a_fork_that_would_train_nothing_is_refused(api, make_run, queued):
    parent = make_run(RunStatus.STOPPED, name="parent")   # steps = 3
    checkpoint_on_disk(parent, 3)

    refused = api("post", f"/runs/{parent.pk}/fork", {"config": {"name": "f", "steps": 3}})

    assert refused.status_code == 409 and "would train nothing" in refused.json()["detail"]
    assert Run.objects.count() == 1 and queued == []
    default = api("post", f"/runs/{parent.pk}/fork").json()   # as many steps again
    assert default["config"]["steps"] == 6


def test_only_a_finished_run_can_be_archived(api, make_run):
    running = make_run()

    refused = api("post", f"/runs/{running.pk}/archive")

    assert refused.status_code == 409 and "stop it first" in refused.json()["detail"]


def test_priority_changes_only_while_the_run_waits(api, make_run):
    waiting, running = make_run(RunStatus.QUEUED), make_run()

    assert api("post", f"/runs/{waiting.pk}/priority", {"priority": 7}).json()["priority"] == 7
    refused = api("post", f"/runs/{running.pk}/priority", {"priority": 7})

    assert refused.status_code == 409 and "only a queued run" in refused.json()["detail"]
    out_of_range = api("post", f"/runs/{waiting.pk}/priority", {"priority": 10**6})
    assert out_of_range.status_code == 400


def test_metric_series_by_name_and_step_range_downsampled(api, make_run):
    run = make_run()
    MetricPoint.objects.bulk_create(
        [MetricPoint(run=run, step=s, name="bubble", value=s) for s in range(100)]
        + [MetricPoint(run=run, step=s, name="rollout_share", value=-s) for s in range(100)])

    both = api("get", f"/runs/{run.pk}/metrics?name=bubble&name=rollout_share").json()
    window = api("get", f"/runs/{run.pk}/metrics", name="bubble", start=10, end=19).json()
    thin = api("get", f"/runs/{run.pk}/metrics", name="bubble", points=5).json()

    assert len(both["series"]["bubble"]["steps"]) == 100
    assert both["series"]["rollout_share"]["values"][-1] == -99
    assert window["series"]["bubble"]["steps"] == list(range(10, 20))
    # two step ranges, each its low and high, then the newest point
    assert thin["series"]["bubble"]["steps"] == [0, 49, 50, 99]
    assert api("get", f"/runs/{run.pk}/metric-names").json() == {
        "names": ["bubble", "rollout_share"]}
    missing = api("get", f"/runs/{run.pk}/metrics")
    assert missing.status_code == 400 and missing.json()["errors"][0]["field"] == "name"
    assert api("get", f"/runs/{run.pk}/metrics", name="bubble",
               points="x").json()["errors"][0]["field"] == "points"


def test_events_read_on_from_a_seq_and_filter_by_type(api, make_run):
    run = make_run()
    for seq, kind in enumerate(["log", "metrics", "log", "log"], start=1):
        RunEvent.objects.create(run=run, seq=seq, type=kind, ts=seq,
                                payload={"seq": seq, "type": kind, "message": f"m{seq}"})

    page = api("get", f"/runs/{run.pk}/events", type="log", limit=2).json()
    rest = api("get", f"/runs/{run.pk}/events", type="log", after_seq=page["last_seq"]).json()

    assert [e["seq"] for e in page["events"]] == [1, 3] and page["last_seq"] == 3
    assert [e["seq"] for e in rest["events"]] == [4]


def test_checkpoints_are_listed_by_step(api, make_run):
    run = make_run()
    for step in (6, 3):
        Checkpoint.objects.create(run=run, step=step, version=step, path=f"/c/{step}")

    assert [c["step"] for c in api("get", f"/runs/{run.pk}/checkpoints").json()] == [3, 6]


# --- alerts, presets, cluster -----------------------------------------------------------------

def test_alerts_are_listed_by_state_and_kind_and_moved_by_operators(api, make_run):
    run = make_run()
    alert = Alert.objects.create(run=run, kind="BubbleHigh", dedup_key="b", cause="c",
                                 runbook="r")
    Alert.objects.create(run=run, kind="StuckReward", dedup_key="s", cause="c", runbook="r")

    assert [a["id"] for a in api("get", "/alerts", kind="BubbleHigh").json()] == [alert.pk]
    acked = api("post", f"/alerts/{alert.pk}/acknowledge").json()
    assert acked["state"] == AlertState.ACKNOWLEDGED
    assert [a["id"] for a in api("get", "/alerts", state="acknowledged").json()] == [alert.pk]
    resolved = api("post", f"/alerts/{alert.pk}/resolve").json()
    assert resolved["state"] == AlertState.RESOLVED and "olga" in resolved["resolved_reason"]
    assert api("get", "/alerts", state="closed").status_code == 400


def test_presets_are_listed_with_their_configs(api):
    preset = Preset.objects.create(name="tiny", config={"steps": 3})

    listed = api("get", "/presets").json()
    one = api("get", f"/presets/{preset.pk}").json()

    assert [p["name"] for p in listed] == ["tiny"] and one["config"]["steps"] == 3


def test_the_cluster_view_says_when_ray_does_not_answer_and_lists_the_queue(
        api, make_run, monkeypatch):
    def unreachable(path):
        raise cluster.ClusterUnreachable(f"{path}: connection refused")
    monkeypatch.setattr(cluster, "fetch_json", unreachable)
    waiting = make_run(RunStatus.QUEUED)

    body = api("get", "/cluster").json()

    assert "connection refused" in body["error"] and body["nodes"] == []
    assert [q["id"] for q in body["queue"]] == [waiting.pk]


# --- the settings page --------------------------------------------------------------------------

def test_a_token_is_shown_once_on_the_settings_page_and_revoked_there(client):
    user = User.objects.create_user("vic")
    client.force_login(user)

    page = client.post("/settings/tokens", {"name": "laptop"})

    raw = page.context["created"]
    assert raw in page.content.decode() and ApiToken.user_for(raw) == user
    assert "no-store" in page["Cache-Control"]  # no cache keeps the token shown once
    again = client.get("/settings/tokens").content.decode()
    assert raw not in again and "laptop" in again
    client.post(f"/settings/tokens/{ApiToken.objects.get().pk}/revoke")
    assert ApiToken.user_for(raw) is None
    other = User.objects.create_user("mallory")
    _, theirs = ApiToken.issue(other, "x")
    assert client.post(f"/settings/tokens/{ApiToken.objects.get(user=other).pk}/revoke") \
        .status_code == 404
    assert ApiToken.user_for(theirs) == other


def test_the_docs_page_renders_the_schema_for_a_logged_in_user_from_local_files(client):
    assert client.get(f"{API}/docs").status_code in (401, 403)
    client.force_login(User.objects.create_user("vic"))

    page = client.get(f"{API}/docs").content.decode()
    schema = client.get(f"{API}/schema")

    assert "swagger-ui" in page and "cdn." not in page  # served from static: works offline
    assert schema.status_code == 200 and b"/api/v1/runs" in schema.content


def test_an_archived_run_leaves_the_runs_page(api, client, make_run):
    kept, archived = make_run(RunStatus.STOPPED, name="kept"), make_run(
        RunStatus.STOPPED, name="gone-to-archive")

    assert api("post", f"/runs/{archived.pk}/archive").json()["archived"] is True

    client.force_login(User.objects.get(username="olga"))
    page = client.get("/").content.decode()
    assert f'id="run-{kept.pk}"' in page and "gone-to-archive" not in page


# --- throughput baseline ---------------------------------------------------------------------

def test_a_baseline_is_marked_and_cleared_and_a_bad_one_is_400_naming_the_field(api, make_run):
    from .test_alerts_outputs import stored_step

    run, timed, untimed = make_run(), make_run(name="timed"), make_run(name="untimed")
    for step in range(3):
        stored_step(timed, step, 1.0)
    stored_step(untimed, 0, 1.0)             # only its first step: nothing to compare with
    path = f"/runs/{run.pk}/baseline"

    for bad, words in ((run.pk, f"run #{run.pk} cannot be its own baseline"),
                       (999_999, "there is no run #999999"),
                       (untimed.pk, f"run #{untimed.pk} has no timed steps"),
                       ("seven", "valid integer")):
        response = api("post", path, {"baseline_run": bad})
        assert response.status_code == 400, bad
        [error] = response.json()["errors"]
        assert error["field"] == "baseline_run" and words in error["message"], error

    response = api("post", path, {"baseline_run": timed.pk})
    assert response.status_code == 200 and response.json()["baseline_run"] == timed.pk
    assert api("get", f"/runs/{run.pk}").json()["baseline_run"] == timed.pk
    assert api("post", path, {"baseline_run": None}).json()["baseline_run"] is None
    assert Run.objects.get(pk=run.pk).baseline_run is None
