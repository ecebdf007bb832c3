"""HTTP API for the engine, authenticated by the run's own token:

    POST /api/runs/<id>/events   ingest a batch of events
    GET  /api/runs/<id>/controls ?after=ID -> {"stop": bool, "controls": [...]}: the driver
                                 polls it (engine/ray_job.py ControlPoller); on "stop" it
                                 checkpoints and exits, and it applies the live controls
                                 not yet applied after that id
"""

from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import close_old_connections, connection
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from jobs.auth import bearer_token
from jobs.ingest.batch import MalformedBatch, parse_event_batch
from jobs.ingest.store import do_ingest_events
from jobs.models import Run, RunControl, RunEvent
from jobs.models.validators import parse_pk
from jobs.prometheus import INGEST_BATCHES, INGEST_EVENTS, INGEST_SECONDS


def error(status: int, message: str, **headers) -> JsonResponse:
    return JsonResponse({"error": message}, status=status, headers=headers)


def run_for_token(request, run_id: int) -> Run | JsonResponse:
    """The run whose own ingest token the request carries, or the error response to send."""
    token = bearer_token(request)
    if token is None:
        return error(401, "send the run's ingest token as 'Authorization: Bearer <token>'",
                     **{"WWW-Authenticate": "Bearer"})
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        return error(404, f"run {run_id} does not exist")
    if not run.has_ingest_token(token):
        return error(403, f"this token is not run {run_id}'s ingest token")
    return run


# Under ASGI each request runs in a thread of its own, with a database connection of its
# own: 100 drivers posting at once held 100 connections (PostgreSQL's default limit) and
# some batches were answered 500. A batch is CPU work under the process's one GIL, so a
# few at a time keep the database as busy: they run on RLPLANE_INGEST_CONCURRENCY
# long-lived threads, the rest wait for one. Each thread keeps its connection from batch
# to batch (CONN_MAX_AGE): a connection per request, closed with it, cost PostgreSQL a new
# backend with cold catalog caches (and ingest its staging table) every batch, about a
# quarter of a batch's time.
INGEST_THREADS = ThreadPoolExecutor(settings.RLPLANE_INGEST_CONCURRENCY,
                                    thread_name_prefix="ingest")


def release_connection() -> None:
    """Close this request's connection, if it opened one: its thread ends with the
    request, and CONN_MAX_AGE kept the connection open for a thread that never comes back
    until it was collected (PostgreSQL refused new clients with only 4 batches at a time
    per process). Inside a transaction (a test's) it stays."""
    if not connection.in_atomic_block:
        connection.close()


@csrf_exempt  # token-authenticated, no cookies: CSRF does not apply
@require_POST
def ingest_events(request, run_id: int):
    """POST {"events": [...]} -> 200 {stored, duplicates, last_seq}; a partly bad batch
    stores the good events and answers 400 with the same counts plus errors."""
    if connection.in_atomic_block:
        # The caller's transaction (a test's) holds this thread's connection: the batch
        # belongs in it.
        response = ingest_timed(request, run_id)
    else:
        try:
            response = INGEST_THREADS.submit(ingest_on_thread, request, run_id).result()
        finally:
            release_connection()
    INGEST_BATCHES.labels(str(response.status_code)).inc()
    return response


def ingest_on_thread(request, run_id: int) -> JsonResponse:
    close_old_connections()  # what a request's start does: CONN_MAX_AGE, health check
    return ingest_timed(request, run_id)


def ingest_timed(request, run_id: int) -> JsonResponse:
    with INGEST_SECONDS.time():
        return ingest(request, run_id)


def ingest(request, run_id: int) -> JsonResponse:
    run = run_for_token(request, run_id)
    if isinstance(run, JsonResponse):
        return run
    try:
        batch = parse_event_batch(request.body, RunEvent.highest_seq(run))
    except RequestDataTooBig:
        return error(413, "the batch is too large; send fewer events per request")
    except MalformedBatch as exc:
        return error(exc.status, str(exc))
    try:
        result = do_ingest_events(run, batch.events, capped=True)
    except Run.DoesNotExist:   # deleted meanwhile
        return error(404, f"run {run_id} does not exist")
    INGEST_EVENTS.labels("stored").inc(result.stored)
    INGEST_EVENTS.labels("duplicate").inc(result.duplicates)
    body = {"stored": result.stored, "duplicates": result.duplicates,
            "last_seq": result.last_seq}
    errors = batch.errors + list(result.refused)
    if errors:
        return JsonResponse({**body, "errors": errors}, status=400)
    return JsonResponse(body)


@require_GET
def control_poll(request, run_id: int):
    """GET ?after=ID -> {"stop": bool, "controls": [{"id", "kind", "value"?, "requested_by"}]}:
    the live controls after ``after`` that the driver has not reported applied, in order."""
    run = run_for_token(request, run_id)
    if isinstance(run, JsonResponse):
        return run
    after = request.GET.get("after", "0")
    after_id = parse_pk(after)
    if after_id is None:
        return error(400, "after must be a control id (at most 18 ASCII digits), got "
                          f"{after[:40]!r}")
    pending = (RunControl.objects.filter(run=run, pk__gt=after_id, applied_at=None)
               .select_related("requested_by").order_by("pk"))
    return JsonResponse({"stop": run.stop_requested_at is not None,
                         "controls": [c.as_engine_dict() for c in pending]})
