"""MLflow's wire format: its error shape, request fields as the client sends them
(protobuf JSON: int64 may come as a string, a NaN metric as "NaN"), and the run and
experiment objects it parses back."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from django.db.models import OuterRef, Subquery
from django.http import JsonResponse

from jobs.models import MetricPoint, Run, RunStatus

# MLflow's own limits (mlflow/utils/validation.py), so a client that passes its own
# validation passes ours.
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_TAGS_PER_BATCH = 100
MAX_KEY_CHARS = 250
MAX_PARAM_CHARS = 6000
MAX_TAG_CHARS = 8000
MAX_EXPERIMENT_NAME_CHARS = 500

DEFAULT_EXPERIMENT = ("0", "Default")
"""MLflow's default experiment, what start_run uses when none was set."""

STATUS_CODES = {"INVALID_PARAMETER_VALUE": 400, "UNAUTHENTICATED": 401,
                "PERMISSION_DENIED": 403, "RESOURCE_DOES_NOT_EXIST": 404,
                "ENDPOINT_NOT_FOUND": 404}

# rlplane's run states as MLflow's RunStatus names.
MLFLOW_STATUS = {RunStatus.QUEUED: "SCHEDULED", RunStatus.SUBMITTING: "SCHEDULED",
                 RunStatus.RUNNING: "RUNNING", RunStatus.STOPPING: "RUNNING",
                 RunStatus.SUCCEEDED: "FINISHED", RunStatus.FAILED: "FAILED",
                 RunStatus.STOPPED: "KILLED", RunStatus.LOST: "FAILED"}
# An ended MLflow run as the engine's run.status value ingest follows.
ENDED = {"FINISHED": "succeeded", "FAILED": "failed", "KILLED": "stopped"}
NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
INTEGER = re.compile(r"^-?\d{1,16}$")


class MlflowError(Exception):
    """An answer in MLflow's error shape; the client raises it as an MlflowException."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code

    def response(self) -> JsonResponse:
        return JsonResponse({"error_code": self.code, "message": str(self)},
                            status=STATUS_CODES[self.code])


def invalid(message: str) -> MlflowError:
    return MlflowError("INVALID_PARAMETER_VALUE", message)


def request_fields(request) -> dict[str, Any]:
    """A GET's query parameters or a POST's JSON object."""
    if request.method == "GET":
        return request.GET.dict()
    try:
        data = json.loads(request.body or b"{}")
    except (ValueError, RecursionError):
        raise invalid("the request body is not JSON") from None
    if not isinstance(data, dict):
        raise invalid("the request body must be a JSON object")
    return data


def text(fields: dict, name: str, limit: int, required: bool = True) -> str:
    value = fields.get(name)
    if value is None or value == "":
        if required:
            raise invalid(f"missing value for required parameter '{name}'")
        return ""
    if not isinstance(value, str) or "\x00" in value or len(value) > limit:
        raise invalid(f"'{name}' must be a string of at most {limit} characters")
    return value


def integer(value: Any, name: str, default: int) -> int:
    """An int64 field: protobuf JSON sends it as a number or a decimal string."""
    if value is None:
        return default
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and INTEGER.match(value):
        return int(value)
    raise invalid(f"'{name}' must be an integer, got {value!r}")


def metric_value(value: Any, key: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and value in NON_FINITE:
        return NON_FINITE[value]
    raise invalid(f"metric '{key}' must be a number, got {value!r}")


def entries(fields: dict, name: str, limit: int) -> list[dict]:
    items = fields.get(name) or []
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise invalid(f"'{name}' must be a list of objects")
    if len(items) > limit:
        raise invalid(f"a batch may hold at most {limit} {name}, got {len(items)}")
    return items


def key_values(items: list[dict], limit: int) -> dict[str, str]:
    """MLflow params or tags ({key, value} entries) as a dict, each bounded."""
    pairs = {}
    for item in items:
        key = text(item, "key", MAX_KEY_CHARS)
        pairs[key] = text(item, "value", limit, required=False)
    return pairs


def experiment_id_of(name: str) -> str:
    return DEFAULT_EXPERIMENT[0] if name == DEFAULT_EXPERIMENT[1] else name


def experiment_json(experiment_id: str) -> dict:
    name = DEFAULT_EXPERIMENT[1] if experiment_id == DEFAULT_EXPERIMENT[0] else experiment_id
    return {"experiment_id": experiment_id, "name": name, "artifact_location": "",
            "lifecycle_stage": "active", "tags": []}


def artifact_uri(run: Run) -> str:
    """Where the client uploads artifacts: this endpoint, which drops them (views.
    drop_artifact). An empty URI would make the client write them into the training
    script's working directory instead."""
    return f"mlflow-artifacts:/rlplane/runs/{run.pk}"


def millis(moment) -> int | None:
    return int(moment.timestamp() * 1000) if moment else None


def as_param(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def run_json(run: Run, params: dict, meta: dict) -> dict:
    """GetRun's ``run``: info, and data with the run's params, tags and latest metrics
    (MetricPoint keeps no time: their timestamp is 0)."""
    info = {"run_id": str(run.pk), "run_uuid": str(run.pk), "run_name": run.name,
            "experiment_id": meta.get("experiment_id", DEFAULT_EXPERIMENT[0]),
            "user_id": run.created_by.username if run.created_by else "",
            "status": MLFLOW_STATUS[run.status], "artifact_uri": artifact_uri(run),
            "lifecycle_stage": "active",
            "start_time": millis(run.started_at or run.created_at)}
    if run.finished_at:
        info["end_time"] = millis(run.finished_at)
    newest = (MetricPoint.objects.filter(run=run, name=OuterRef("name"))
              .order_by("-step").values("step")[:1])
    latest = [{"key": name, "step": step, "timestamp": 0,
               "value": "NaN" if value is None else value}
              for name, step, value in MetricPoint.objects.filter(run=run, step=Subquery(newest))
              .order_by("name").values_list("name", "step", "value")]
    tags = {**meta.get("tags", {}), "mlflow.runName": run.name}
    return {"info": info,
            "data": {"metrics": latest,
                     "params": [{"key": k, "value": as_param(v)} for k, v in params.items()],
                     "tags": [{"key": k, "value": v} for k, v in tags.items()]},
            "inputs": {}}
