"""The public REST API under /api/v1/ (Django REST framework; OpenAPI by drf-spectacular).

    runs.py         runs: list, launch, detail, stop, fork, archive, priority, metrics,
                    events, checkpoints
    views.py        alerts (list, acknowledge, resolve), presets, cluster
    auth.py         per-user API tokens (or the browser session); the pages' role rules
    errors.py       every error as JSON with the field path
    middleware.py   ... also when another layer answers under /api/ (no route, a 500 page)
    parsers.py      JSON bodies: nesting bounded, NUL refused (jobs/untrusted.py)
    schema.py       the error codes every operation declares, the controls' body
    openapi.yaml    the generated schema, checked in (tests/jobs/test_rest_schema.py);
                    GET /api/v1/schema serves it live, /api/v1/docs renders it

Every change goes through jobs/runs/actions.py, as the pages' do. The engine's ingest endpoint
(jobs/ingest/endpoints.py, run-token auth) is a different door and stays where it is.
"""
