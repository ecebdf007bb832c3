"""The MLflow REST endpoints (the subset in jobs/mlflow/__init__.py). Each view takes the
caller (jobs.mlflow.access) and the request's fields and returns MLflow's JSON answer;
an MlflowError anywhere becomes MLflow's error shape."""

from __future__ import annotations

from functools import wraps

from django.core.exceptions import RequestDataTooBig
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt

from jobs.mlflow import actions
from jobs.mlflow.access import Caller, caller_of, readable_run, writable_run
from jobs.mlflow.protocol import (
    MAX_EXPERIMENT_NAME_CHARS,
    MAX_METRICS_PER_BATCH,
    MAX_PARAM_CHARS,
    MAX_PARAMS_TAGS_PER_BATCH,
    MAX_TAG_CHARS,
    MlflowError,
    entries,
    experiment_id_of,
    experiment_json,
    integer,
    invalid,
    key_values,
    request_fields,
    run_json,
    text,
)
from jobs.models import RunStatus


def endpoint(method: str):
    """csrf_exempt (token-authenticated, no cookies), one HTTP method, the caller
    authenticated before the body is read, errors in MLflow's shape."""

    def decorate(view):
        @csrf_exempt
        @wraps(view)
        def wrapped(request):
            try:
                if request.method != method:
                    raise MlflowError("ENDPOINT_NOT_FOUND",
                                      f"{request.path} takes {method}, not {request.method}")
                caller = caller_of(request)
                return JsonResponse(view(caller, request_fields(request)))
            except RequestDataTooBig:
                return invalid("the request is too large; log fewer values at once").response()
            except MlflowError as exc:
                return exc.response()

        return wrapped

    return decorate


def run_id_of(fields: dict) -> str:
    return fields.get("run_id") or fields.get("run_uuid") or ""


def run_answer(run) -> dict:
    params, meta = actions.split_params(run)
    return run_json(run, params, meta)


@endpoint("GET")
def get_experiment_by_name(caller: Caller, fields: dict) -> dict:
    name = text(fields, "experiment_name", MAX_EXPERIMENT_NAME_CHARS)
    return {"experiment": experiment_json(experiment_id_of(name))}


@endpoint("GET")
def get_experiment(caller: Caller, fields: dict) -> dict:
    return {"experiment": experiment_json(
        text(fields, "experiment_id", MAX_EXPERIMENT_NAME_CHARS))}


@endpoint("POST")
def create_experiment(caller: Caller, fields: dict) -> dict:
    """Every name already is an experiment; creating one changes nothing."""
    name = text(fields, "name", MAX_EXPERIMENT_NAME_CHARS)
    return {"experiment_id": experiment_id_of(name)}


@endpoint("POST")
def create_run(caller: Caller, fields: dict) -> dict:
    tags = key_values(entries(fields, "tags", MAX_PARAMS_TAGS_PER_BATCH), MAX_TAG_CHARS)
    run = actions.do_open_run(
        caller, text(fields, "experiment_id", MAX_EXPERIMENT_NAME_CHARS, required=False),
        text(fields, "run_name", MAX_EXPERIMENT_NAME_CHARS, required=False), tags)
    return {"run": run_answer(run)}


@endpoint("GET")
def get_run(caller: Caller, fields: dict) -> dict:
    return {"run": run_answer(readable_run(caller, run_id_of(fields)))}


@endpoint("POST")
def update_run(caller: Caller, fields: dict) -> dict:
    """The client's end_run (FINISHED, FAILED, KILLED) ends the run as a driver's final
    status would; RUNNING starts one that still waits. A new run_name is not taken:
    rlplane's run names follow their own rules."""
    run = writable_run(caller, run_id_of(fields))
    status = fields.get("status")
    if status is not None:
        if status not in ("RUNNING", "SCHEDULED", *actions.ENDED):
            raise invalid(f"unknown run status {status!r}")
        end_time = integer(fields.get("end_time"), "end_time", 0) or None
        if status in actions.ENDED or (status == "RUNNING" and run.status in (
                RunStatus.QUEUED, RunStatus.SUBMITTING)):
            run = actions.do_report(run, [actions.status_event(status, end_time)])
    run.refresh_from_db()
    return {"run_info": run_answer(run)["info"]}


@endpoint("POST")
def log_batch(caller: Caller, fields: dict) -> dict:
    run = writable_run(caller, run_id_of(fields))
    metrics = actions.metric_events(entries(fields, "metrics", MAX_METRICS_PER_BATCH))
    params = key_values(entries(fields, "params", MAX_PARAMS_TAGS_PER_BATCH), MAX_PARAM_CHARS)
    tags = key_values(entries(fields, "tags", MAX_PARAMS_TAGS_PER_BATCH), MAX_TAG_CHARS)
    actions.do_report(run, metrics, params=params, tags=tags)
    return {}


@endpoint("POST")
def log_metric(caller: Caller, fields: dict) -> dict:
    run = writable_run(caller, run_id_of(fields))
    actions.do_report(run, actions.metric_events([fields]))
    return {}


@endpoint("POST")
def log_param(caller: Caller, fields: dict) -> dict:
    run = writable_run(caller, run_id_of(fields))
    actions.do_report(run, params=key_values([fields], MAX_PARAM_CHARS))
    return {}


@endpoint("POST")
def set_tag(caller: Caller, fields: dict) -> dict:
    run = writable_run(caller, run_id_of(fields))
    actions.do_report(run, tags=key_values([fields], MAX_TAG_CHARS))
    return {}


@endpoint("POST")
def accept_and_drop(caller: Caller, fields: dict) -> dict:
    """Datasets, models and outputs: rlplane keeps none of them, and a training script
    must not fail for logging them, so the caller's right to write is checked and
    nothing stored."""
    writable_run(caller, run_id_of(fields))
    return {}


@csrf_exempt
def drop_artifact(request, run_id: str, name: str):
    """PUT of an artifact (veRL's validation generations, NeMo-RL's plots) under the
    run's artifact_uri: rlplane keeps no artifacts, and a refusal would raise into
    NeMo-RL's training loop, so it is dropped and the run's log says so."""
    try:
        if request.method != "PUT":
            raise MlflowError("ENDPOINT_NOT_FOUND", "rlplane keeps no MLflow artifacts")
        run = writable_run(caller_of(request), run_id)
        actions.do_drop_artifact(run, name)
    except MlflowError as exc:
        return exc.response()
    return JsonResponse({})


@csrf_exempt
def not_served(request, rest: str = ""):
    return MlflowError("ENDPOINT_NOT_FOUND", f"rlplane's MLflow endpoint does not serve "
                       f"{request.path}; see jobs/mlflow/__init__.py for what it "
                       "serves").response()
