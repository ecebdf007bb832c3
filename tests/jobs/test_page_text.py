"""Every page as rendered: nothing of a template's own source shows as text. Django's
``{# #}`` comment ends at the line's end; one spanning lines is printed as it stands (the
fork and compare pages once showed "{# The planner's what-if table ... #}")."""

import re

from django.urls import URLPattern, URLResolver, get_resolver

from jobs.models import Alert, Preset, RunStatus

from .helpers import checkpoint_on_disk

SKIP = ("admin/", "mlflow/", "api/v1/")   # the admin's own pages and JSON, not ours


def routes(patterns=None, prefix=""):
    """Every route the project serves, as written ("runs/<int:run_id>/fork")."""
    for entry in get_resolver().url_patterns if patterns is None else patterns:
        if isinstance(entry, URLResolver):
            yield from routes(entry.url_patterns, prefix + str(entry.pattern))
        elif isinstance(entry, URLPattern):
            yield prefix + str(entry.pattern)


def test_no_page_shows_a_template_comment_as_text(client, operator, make_run, settings,
                                                  tmp_path):
    settings.RLPLANE_RUNS_DIR = tmp_path / "runs"
    run = make_run(RunStatus.STOPPED)
    checkpoint_on_disk(run, 2)
    other = make_run(RunStatus.SUCCEEDED)
    ids = {"run_id": run.pk, "alert_id": Alert.objects.create(
               run=run, kind="BubbleHigh", dedup_key="b", cause="c", runbook="r").pk,
           "preset_id": Preset.objects.create(name="p", config={"name": "p"}).pk,
           "token_id": 1}
    extra = {"runs/compare": f"?ids={run.pk},{other.pk}"}

    checked = []
    for route in routes():
        if route.startswith(SKIP) and route != "api/v1/docs" or "<path:" in route:
            continue
        path = "/" + re.sub(r"<int:(\w+)>", lambda m: str(ids[m.group(1)]), route)
        response = client.get(path + extra.get(route, ""))
        if response.status_code != 200 or "text/html" not in response["Content-Type"]:
            continue
        html = response.content.decode()
        assert "{#" not in html and "#}" not in html, f"{path} shows a template comment"
        checked.append(route)

    assert {"", "runs/<int:run_id>", "runs/<int:run_id>/fork", "runs/compare",
            "runs/<int:run_id>/samples", "runs/new", "cluster", "alerts",
            "api/v1/docs"} <= set(checked), checked


def test_the_favicon_is_served_where_browsers_ask_for_it(client):
    response = client.get("/favicon.ico")
    assert response.status_code == 301 and response.url.endswith("favicon.svg")
    assert client.get(response.url).status_code == 200


def test_the_api_docs_show_the_authorization_header_as_code(client, operator):
    schema = client.get("/api/v1/schema").content.decode()
    # Markdown: a bare <token> is an HTML tag, and the docs read "Bearer '."
    assert "`Authorization: Bearer <token>`" in schema
