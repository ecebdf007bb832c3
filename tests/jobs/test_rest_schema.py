"""The checked-in OpenAPI schema (jobs/rest/openapi.yaml) is the one the code generates,
and it validates against the OpenAPI 3 meta-schema. Regenerate it with

    python manage.py spectacular --validate --file jobs/rest/openapi.yaml
"""

from pathlib import Path

import yaml
from django.core.management import call_command

SCHEMA = Path(__file__).resolve().parents[2] / "jobs" / "rest" / "openapi.yaml"


def test_the_checked_in_schema_is_the_generated_one_and_it_validates(tmp_path):
    fresh = tmp_path / "openapi.yaml"

    # --validate raises on a schema that breaks the OpenAPI 3 meta-schema;
    # --fail-on-warn on an endpoint drf-spectacular could not describe.
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(fresh))

    assert fresh.read_text() == SCHEMA.read_text(), (
        "jobs/rest/openapi.yaml is stale: run `python manage.py spectacular --validate "
        "--file jobs/rest/openapi.yaml` and commit it")


def test_the_schema_documents_every_api_route_with_token_auth():
    schema = yaml.safe_load(SCHEMA.read_text())

    assert schema["components"]["securitySchemes"]["token"]["scheme"] == "bearer"
    paths = set(schema["paths"])
    for route in ("/api/v1/runs", "/api/v1/runs/{run_id}/stop", "/api/v1/runs/{run_id}/fork",
                  "/api/v1/runs/{run_id}/archive", "/api/v1/runs/{run_id}/priority",
                  "/api/v1/runs/{run_id}/metrics", "/api/v1/runs/{run_id}/events",
                  "/api/v1/runs/{run_id}/checkpoints", "/api/v1/runs/{run_id}/controls",
                  "/api/v1/alerts/{alert_id}/acknowledge",
                  "/api/v1/alerts/{alert_id}/resolve", "/api/v1/presets", "/api/v1/cluster"):
        assert route in paths, route
