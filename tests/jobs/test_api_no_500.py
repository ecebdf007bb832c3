"""No input reaches a 500 (issue 33): each input that did is now a declared 4xx with the
JSON error shape, and a sweep sends every hostile shape to every API route."""

import json

import pytest
from django.urls import URLPattern, get_resolver

from jobs.models import Run

from .helpers import api_token, checkpoint_on_disk

pytestmark = pytest.mark.django_db

DEEP_JSON = '{"config": {"name": "deep", "x": ' + "[" * 100_000 + "]" * 100_000 + "}}"
DEEP_TOML = json.dumps({"toml": "x = " + "[" * 100_000 + "]" * 100_000})
HUGE = "9223372036854775808"         # 2**63: past every database integer
HOSTILE_VALUES = [HUGE, "\u00b2", "9" * 5000, "-1", "\u0663", "1e3", "\x00"]


@pytest.fixture
def operator(client):
    client.raise_request_exception = False  # a 500 is an answer here, not an error
    return {"HTTP_AUTHORIZATION": f"Bearer {api_token('olga', operator=True)}"}


@pytest.fixture
def run():
    return Run.objects.create(name="r", config={"name": "r", "steps": 3})


def assert_json_error(response, status):
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert body.get("detail") or body.get("error"), body
    return body


def test_a_run_id_past_the_database_integer_is_a_400_on_the_alert_list(client, operator):
    body = assert_json_error(client.get(f"/api/v1/alerts?run={HUGE}", **operator), 400)
    assert body["errors"] == [{"field": "run", "message":
                               f"must be an integer from 0 to {2**63 - 1}, got {HUGE}"}]


@pytest.mark.parametrize("body", [DEEP_JSON, DEEP_TOML], ids=["json", "toml"])
def test_a_launch_nested_100k_deep_is_a_400(client, operator, body):
    response = client.post("/api/v1/runs", body, content_type="application/json", **operator)
    assert "nest" in json.dumps(assert_json_error(response, 400))
    assert not Run.objects.filter(name="deep").exists()


@pytest.mark.parametrize("after", ["\u00b2", "9" * 5000, "9" * 20], ids=["superscript",
                                                                         "5000 digits", "2**66"])
def test_the_driver_control_poll_refuses_an_after_that_is_no_id(client, run, after):
    client.raise_request_exception = False
    response = client.get(f"/api/runs/{run.pk}/controls", {"after": after},
                          HTTP_AUTHORIZATION=f"Bearer {run.issue_ingest_token()}")
    assert "after must be a control id" in assert_json_error(response, 400)["error"]


def test_a_non_ascii_bearer_token_is_refused_on_metrics_and_the_api(client, settings):
    settings.RLPLANE_METRICS_TOKEN = "scrape"
    client.raise_request_exception = False
    hostile = {"HTTP_AUTHORIZATION": "Bearer \u00e9t\u00e9"}

    assert client.get("/metrics", **hostile).status_code == 403
    assert_json_error(client.get("/api/v1/runs", **hostile), 401)


def test_a_path_no_route_matches_answers_json_not_an_html_page(client, operator):
    body = assert_json_error(client.get("/api/v1/runs/abc", **operator), 404)
    assert "ids in paths are integers" in body["detail"]
    assert_json_error(client.get("/api/v1/no-such-thing", **operator), 404)
    # The ingest door's own refusals say "error"; an answer from another layer must not,
    # or the engine's sender would set a batch aside instead of retrying it.
    assert "error" not in assert_json_error(client.get("/api/runs/1/events"), 405)


@pytest.mark.parametrize("body", [
    {"config": {"name": "nul", "steps": 3, "rollout": {"system_prompt": "a\x00b"}}},
    {"toml": 'name = "nul"\nsteps = 3\n[rollout]\nsystem_prompt = "a\\u0000b"\n'},
], ids=["json", "toml"])
def test_a_nul_in_a_config_string_is_a_field_error(client, operator, body):
    response = client.post("/api/v1/runs", json.dumps(body), content_type="application/json",
                           **operator)
    errors = assert_json_error(response, 400)["errors"]
    assert errors[0]["field"].endswith("rollout.system_prompt") and "NUL" in errors[0]["message"]


def test_a_fork_merges_a_partial_config_into_the_parents_and_needs_a_checkpoint(
        client, operator, queued):
    parent = Run.objects.create(name="p", config={"name": "p", "steps": 3,
                                                  "rollout": {"temperature": 0.5}})
    refused = client.post(f"/api/v1/runs/{parent.pk}/fork", "{}",
                          content_type="application/json", **operator)
    assert "no checkpoint on disk" in assert_json_error(refused, 409)["detail"]

    checkpoint_on_disk(parent, 2)
    child = client.post(f"/api/v1/runs/{parent.pk}/fork", json.dumps({"config": {"steps": 9}}),
                        content_type="application/json", **operator).json()
    same = client.post(f"/api/v1/runs/{parent.pk}/fork", json.dumps({"config": {}}),
                       content_type="application/json", **operator).json()

    assert (child["name"], child["config"]["steps"]) == ("p-fork", 9)
    assert child["config"]["rollout"]["temperature"] == 0.5
    assert same["config"] == {**child["config"], "steps": 3}


def all_routes():
    """(path template, its argument names) of every route."""
    def walk(patterns, prefix):
        for p in patterns:
            if isinstance(p, URLPattern):
                yield prefix + str(p.pattern), list(p.pattern.converters)
            else:
                yield from walk(p.url_patterns, prefix + str(p.pattern))
    return list(walk(get_resolver().url_patterns, "/"))


def api_routes():
    return [(path, args) for path, args in all_routes() if path.startswith("/api/")]


def test_every_api_route_answers_hostile_input_with_a_4xx(client, operator, run, queued):
    """Each route, each id, each query parameter and body field a route reads, with values
    that are no integer a database holds, and tokens no header codec likes."""
    names = ["run", "limit", "after_seq", "start", "end", "points", "step", "ids", "level",
             "after", "checkpoint", "priority", "reward_min", "gap_min", "state", "kind"]
    tokens = ["Bearer \u00e9", "Bearer " + "x" * 10_000, "Basic \x7f", "Bearer \x00"]
    answers = []
    for n, (template, args) in enumerate(api_routes()):
        path, huge_path = template, template
        for arg in args:
            path = path.replace(f"<int:{arg}>", str(run.pk))
            huge_path = huge_path.replace(f"<int:{arg}>", HUGE)
        answers.append((huge_path, client.get(huge_path, **operator).status_code))
        answers.append((path, client.get(path, HTTP_AUTHORIZATION=tokens[n % 4]).status_code))
        for value in HOSTILE_VALUES:
            query = {name: value for name in names}
            answers.append((path, client.get(path, query, **operator).status_code))
        for body in ({name: value for name in names} for value in (HUGE, "\u00b2", 2**64)):
            answers.append((path, client.post(path, json.dumps(body),
                                              content_type="application/json",
                                              **operator).status_code))
    assert len({path for path, _ in answers}) >= 20
    assert [(path, code) for path, code in answers if code >= 500] == []


def test_every_page_answers_hostile_query_and_form_values_with_no_500(client, run, queued,
                                                                       django_user_model):
    """The pages too, as a logged-in operator: every route, every parameter a page reads."""
    from django.contrib.auth.models import Group

    from jobs.auth import OPERATOR_GROUP

    user = django_user_model.objects.create_user("page-operator")
    user.groups.add(Group.objects.get_or_create(name=OPERATOR_GROUP)[0])
    client.force_login(user)
    client.raise_request_exception = False
    names = ["ids", "level", "step", "reward_min", "reward_max", "gap_min", "order", "status",
             "name", "archived", "priority", "value", "kind", "checkpoint", "toml", "state"]
    answers = []
    for template, args in [(p, a) for p, a in all_routes() if not p.startswith(
            ("/api/", "/admin/", "/mlflow/"))]:
        path = template
        for arg in args:
            path = path.replace(f"<int:{arg}>", str(run.pk))
        for value in (HUGE, "\u00b2", "\x00", "9" * 5000):
            query = {name: value for name in names}
            answers.append((path, client.get(path, query).status_code))
            answers.append((path, client.post(path, query).status_code))
    assert len(answers) > 40
    assert [(path, code) for path, code in answers if code >= 500] == []


def test_every_mlflow_route_answers_a_run_id_that_is_no_id_with_no_500(client, run, queued):
    """The MLflow door's run ids: "²" passes str.isdigit() but not int()."""
    client.raise_request_exception = False
    token = {"HTTP_AUTHORIZATION": f"Bearer {api_token('mlflow-op', operator=True)}"}
    answers = []
    for path in [p for p, _ in all_routes() if p.startswith("/mlflow/")]:
        for value in ("\u00b2", HUGE, "9" * 5000):
            body = {"run_id": value, "run_uuid": value, "experiment_id": value, "key": "k",
                    "value": value, "timestamp": value, "step": value}
            answers.append((path, client.get(path, body, **token).status_code))
            answers.append((path, client.post(path, json.dumps(body),
                                              content_type="application/json",
                                              **token).status_code))
    assert len(answers) > 20
    assert [(path, code) for path, code in answers if code >= 500] == []
