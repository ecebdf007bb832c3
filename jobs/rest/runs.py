"""Runs over HTTP: the same actions as the pages (jobs/runs/actions.py), as JSON.

    GET  /api/v1/runs                      ?status=running,queued &name= &archived=1 &limit=
    POST /api/v1/runs                      {toml | config, priority} -> 201 the queued run
    POST /api/v1/runs/external             {config: {framework, name, params, launch?}}
                                           -> 201 {run, token, ingest_url}
    GET  /api/v1/runs/<id>                 + config, latest metrics, open alerts
    DELETE /api/v1/runs/<id>               a finished run's rows and files -> 204
    GET  /api/v1/runs/compare              ?ids=3,7 &level=0.5: what the compare page draws
    POST /api/v1/runs/<id>/stop            running: checkpoint and exit; queued: cancel
    POST /api/v1/runs/<id>/fork            {checkpoint?, toml | config?, priority}: the
                                           changes, merged into the parent's config
    POST /api/v1/runs/<id>/archive         a finished run leaves the list
    POST /api/v1/runs/<id>/restore         an archived run is back on the list
    POST /api/v1/runs/<id>/priority        {priority}: a queued run's place in the queue
    POST /api/v1/runs/<id>/baseline        {baseline_run: id | null}: the run its
                                           ThroughputRegression compares with
    GET  /api/v1/runs/<id>/metrics         ?name=reward/mean&name=bubble &start= &end= &points=
    GET  /api/v1/runs/<id>/metric-names
    GET  /api/v1/runs/<id>/events          ?after_seq= &type=log &limit=
    GET  /api/v1/runs/<id>/job-log         ?after_line= &limit=: a launched command's output
    GET  /api/v1/runs/<id>/checkpoints
    GET  /api/v1/runs/<id>/controls        the live controls asked of the run, and when
    POST /api/v1/runs/<id>/controls        {kind, value?} -> 201: applied at the next step
"""

from __future__ import annotations

import re

from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status
from rest_framework.decorators import api_view
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.response import Response

from engine.api import validate_control
from engine.config import RunConfig, is_external, validate_config, validate_external
from jobs.alerts.lifecycle import BaselineProblem, do_set_baseline
from jobs.models import (
    LIVE_STATES,
    Checkpoint,
    MetricRollup,
    NotNative,
    Run,
    RunEvent,
    RunStatus,
    latest_values,
    stored_metric_names,
)
from jobs.models.controls import paused
from jobs.queries import history
from jobs.queries.compare import CompareError, RunsMissing, compare_data, selection
from jobs.rest import serializers as s
from jobs.rollups import TIERS
from jobs.runs.actions import (
    Refused,
    do_archive_run,
    do_create_external_run,
    do_delete_run,
    do_fork_run,
    do_launch_run,
    do_request_control,
    do_restore_run,
    do_set_priority,
    do_stop_run,
)
from jobs.runs.forms import toml_table
from jobs.runs.job_logs import job_log_lines

MAX_LIMIT = 1000
MAX_POINTS = 5000
MAX_ID = 2**63 - 1  # the database's integer: a larger id or step reaches no row (and
                    # SQLite raises OverflowError on it)
INTEGER = re.compile(r"-?[0-9]{1,19}")


def config_from(data: dict) -> RunConfig:
    """The request's run config, validated; ConfigError (-> 400 with field paths) if not."""
    config = toml_table(data["toml"]) if "toml" in data else data["config"]
    if is_external(config):
        raise ValidationError({"config.framework": "a run another framework trains is "
                               "created with POST /api/v1/runs/external"})
    return validate_config(config)


def merged(base: dict, changes: dict) -> dict:
    """``changes`` laid over ``base``, table by table: a fork's config names only what
    differs from its parent's. A table whose ``type`` changes (another placement, async
    policy, algorithm) is replaced whole, since the old type's fields do not apply."""
    out = dict(base)
    for key, value in changes.items():
        old = out.get(key)
        if (isinstance(old, dict) and isinstance(value, dict)
                and value.get("type", old.get("type")) == old.get("type")):
            out[key] = merged(old, value)
        else:
            out[key] = value
    return out


def valid(serializer_class, request):
    serializer = serializer_class(data=request.data)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def query_param(request, name: str, parse, expect: str):
    """The query parameter ``name`` read by ``parse`` (which raises ValueError on a bad
    value), None when absent; a bad value (an empty one too) is a 400 naming it: "must be
    <expect>"."""
    raw = request.query_params.get(name)
    if raw is None:
        return None
    try:
        return parse(raw)
    except ValueError:
        raise ValidationError({name: f"must be {expect}, got {raw!r}"}) from None


def ascii_int(raw: str) -> int:
    """int() of ASCII digits only (int() also takes "٣" and raises past 4300 digits), at
    most 19 of them: every integer the database holds."""
    if not INTEGER.fullmatch(raw):
        raise ValueError(raw)
    return int(raw)


def integers(lo: int = 0, hi: int = MAX_ID) -> dict:
    """The schema of an integer parameter that int_param reads with the same bounds."""
    return {"type": "integer", "minimum": lo, "maximum": hi}


def comma_list(items: dict, **bounds) -> dict:
    """The schema of a comma-separated list parameter (?status=running,queued): an array
    in OpenAPI's form style, unexploded."""
    return {"type": "array", "items": items, **bounds}


BOOLEANS = {"true": True, "1": True, "false": False, "0": False}


def boolean(raw: str) -> bool:
    if raw.lower() not in BOOLEANS:
        raise ValueError(raw)
    return BOOLEANS[raw.lower()]


def bool_param(request, name: str) -> bool | None:
    return query_param(request, name, boolean, "true or false")


def int_param(request, name: str, default: int | None = None, lo: int = 0,
              hi: int = MAX_ID) -> int | None:
    """An integer query parameter in [lo, hi] (the schema says the same bounds); a value
    outside, or not ASCII digits, is a 400 naming it."""
    value = query_param(request, name, ascii_int, "an integer")
    if value is None:
        return default
    if not lo <= value <= hi:
        raise ValidationError({name: f"must be an integer from {lo} to {hi}, got {value}"})
    return value


def run_detail(run: Run) -> dict:
    run.latest = {name: {"step": step, "value": value}
                  for name, (step, value) in latest_values([run.pk]).get(run.pk, {}).items()}
    run.open_alerts = list(run.alerts.filter(state__in=LIVE_STATES))
    run.paused = paused(run)
    return s.RunDetailSerializer(run).data


@extend_schema(request=s.ExternalLaunchSerializer,
               responses={201: s.ExternalRunSerializer, 400: s.ErrorSerializer})
@api_view(["POST"])
def external_runs(request):
    """A run another framework trains (TRL, veRL, OpenRLHF, prime-rl, a script): its
    process reports with the returned token (rlplane.track, an adapter, the MLflow
    endpoint); with ``launch`` it is queued and started as a Ray Job instead."""
    data = valid(s.ExternalLaunchSerializer, request)
    config = data["config"]
    if not is_external(config):
        raise ValidationError({"config.framework": "an external run names its framework "
                               '("trl", "verl", "openrlhf", "prime-rl", "script"); launch '
                               "a run of rlplane's own engine with POST /api/v1/runs"})
    cfg = validate_external(config)
    run, token = do_create_external_run(request.user, cfg.model_dump(mode="json"),
                                        priority=data["priority"])
    run.refresh_from_db()
    body = {"run": run_detail(run), "token": token,
            "ingest_url": request.build_absolute_uri("/").rstrip("/")}
    return Response(body, status=status.HTTP_201_CREATED)


@extend_schema(
    methods=["GET"], responses=s.RunSerializer(many=True),
    parameters=[OpenApiParameter("status", comma_list({"type": "string",
                                                       "enum": list(RunStatus.values)}),
                                 style="form", explode=False,
                                 description="comma-separated statuses"),
                OpenApiParameter("name", str, description="part of the name"),
                OpenApiParameter("archived", bool, description="list archived runs too"),
                OpenApiParameter("limit", integers(1, MAX_LIMIT), description="default 100")])
@extend_schema(methods=["POST"], request=s.LaunchSerializer,
               responses={201: s.RunDetailSerializer, 400: s.ErrorSerializer})
@api_view(["GET", "POST"])
def runs(request):
    if request.method == "POST":
        data = valid(s.LaunchSerializer, request)
        cfg = config_from(data)
        run = do_launch_run(request.user, cfg.name, cfg.model_dump(mode="json"),
                            priority=data["priority"])
        run.refresh_from_db()
        return Response(run_detail(run), status=status.HTTP_201_CREATED)
    rows = Run.objects.select_related("created_by")
    statuses = [x for x in request.query_params.get("status", "").split(",") if x]
    unknown = sorted(set(statuses) - set(RunStatus.values))
    if unknown:
        raise ValidationError({"status": f"unknown status {', '.join(unknown)}; one of "
                                         f"{', '.join(RunStatus.values)}"})
    if statuses:
        rows = rows.filter(status__in=statuses)
    if request.query_params.get("name"):
        rows = rows.filter(name__icontains=request.query_params["name"])
    if not bool_param(request, "archived"):
        rows = rows.filter(archived_at=None)
    limit = int_param(request, "limit", 100, 1, MAX_LIMIT)
    return Response(s.RunSerializer(rows[:limit], many=True).data)


@extend_schema(methods=["GET"], responses=s.RunDetailSerializer)
@extend_schema(methods=["DELETE"], responses={204: None, 409: s.ErrorSerializer})
@api_view(["GET", "DELETE"])
def run(request, run_id: int):
    target = get_object_or_404(Run, pk=run_id)
    if request.method == "DELETE":
        do_delete_run(request.user, target)
        return Response(status=status.HTTP_204_NO_CONTENT)
    return Response(run_detail(target))


@extend_schema(responses={200: OpenApiTypes.OBJECT, 400: s.ErrorSerializer,
                          404: s.ErrorSerializer},
               parameters=[OpenApiParameter("ids", comma_list(integers(), minItems=2,
                                                              maxItems=6, uniqueItems=True),
                                            style="form", explode=False, required=True,
                                            description="2 to 6 comma-separated run ids"),
                           OpenApiParameter("level", float,
                                            description="the reward level to time")])
@api_view(["GET"])
def compare(request):
    """The compare page's data: per run its summary, the config keys that differ, and
    the overlaid charts (x by step; each chart's "wall" holds the same points' x in
    seconds since the run's first step)."""
    try:
        runs, level = selection(request)
    except RunsMissing as exc:
        raise NotFound(exc.message) from None
    except CompareError as exc:
        raise ValidationError({exc.field: exc.message}) from None
    return Response(compare_data(runs, level))


@extend_schema(exclude=True)
@api_view(["GET"])
def compare_for_pages(request):
    """The same, at /api/runs/compare where the pages link it; documented once, above."""
    return compare(request._request)


@extend_schema(request=None, responses={200: s.RunDetailSerializer, 409: s.ErrorSerializer})
@api_view(["POST"])
def stop(request, run_id: int):
    target = get_object_or_404(Run, pk=run_id)
    do_stop_run(request.user, target)
    target.refresh_from_db()
    return Response(run_detail(target))


@extend_schema(request=s.ForkSerializer,
               responses={201: s.RunDetailSerializer, 400: s.ErrorSerializer,
                          409: s.ErrorSerializer})
@api_view(["POST"])
def fork(request, run_id: int):
    """A new queued run from a checkpoint of this one (default: its latest): the
    parent's config with the changes given laid over it (a partial config is enough);
    409 when the run has no checkpoint on disk or is an external run."""
    parent = get_object_or_404(Run, pk=run_id)
    data = valid(s.ForkSerializer, request)
    if parent.is_external:
        raise NotNative(parent, "a fork")
    checkpoints = Checkpoint.forkable(parent)
    if "checkpoint" in data:
        checkpoint = checkpoints.filter(pk=data["checkpoint"]).first()
        if checkpoint is None:
            raise ValidationError({"checkpoint": f"run {parent.pk} has no checkpoint "
                                                 f"{data['checkpoint']} on disk"})
    else:
        checkpoint = checkpoints.first()
        if checkpoint is None:  # the run's state, not the request, is what is missing
            raise Refused(f"run {parent.pk} has no checkpoint on disk yet; a fork starts "
                          "from one (a running run writes them every checkpoint_every steps)")
    base = parent.fork_config(checkpoint.step).model_dump(mode="json")
    if "toml" in data or "config" in data:
        changes = toml_table(data["toml"]) if "toml" in data else data["config"]
        cfg = config_from({"config": merged(base, changes)})
    else:
        cfg = validate_config(base)
    child = do_fork_run(request.user, parent, checkpoint, cfg.model_dump(mode="json"),
                        priority=data["priority"])
    child.refresh_from_db()
    return Response(run_detail(child), status=status.HTTP_201_CREATED)


@extend_schema(request=None, responses={200: s.RunSerializer, 409: s.ErrorSerializer})
@api_view(["POST"])
def archive(request, run_id: int):
    target = get_object_or_404(Run, pk=run_id)
    do_archive_run(request.user, target)
    return Response(s.RunSerializer(target).data)


@extend_schema(request=None, responses={200: s.RunSerializer})
@api_view(["POST"])
def restore(request, run_id: int):
    target = get_object_or_404(Run, pk=run_id)
    do_restore_run(request.user, target)
    return Response(s.RunSerializer(target).data)


@extend_schema(request=s.PrioritySerializer,
               responses={200: s.RunSerializer, 409: s.ErrorSerializer})
@api_view(["POST"])
def priority(request, run_id: int):
    target = get_object_or_404(Run, pk=run_id)
    do_set_priority(request.user, target, valid(s.PrioritySerializer, request)["priority"])
    target.refresh_from_db()
    return Response(s.RunSerializer(target).data)


@extend_schema(request=s.BaselineSerializer,
               responses={200: s.RunSerializer, 400: s.ErrorSerializer})
@api_view(["POST"])
def baseline(request, run_id: int):
    """Mark another run as this one's throughput baseline (ThroughputRegression compares
    its samples/s and phase times with that run's first timed steps, ahead of a fork's
    parent's); null clears the mark. 400 naming baseline_run for the run itself, an
    unknown run, or one with no timed steps past its first."""
    target = get_object_or_404(Run, pk=run_id)
    try:
        do_set_baseline(request.user, target, valid(s.BaselineSerializer, request)["baseline_run"])
    except BaselineProblem as exc:
        raise ValidationError({exc.field: str(exc)}) from None
    return Response(s.RunSerializer(target).data)


@extend_schema(
    responses=s.MetricsSerializer,
    parameters=[OpenApiParameter("name", str, many=True, required=True,
                                 description="a metric name (repeat for several)"),
                OpenApiParameter("start", integers(), description="first step"),
                OpenApiParameter("end", integers(), description="last step"),
                OpenApiParameter("points", integers(1, MAX_POINTS),
                                 description="at most this many per series (default 500): "
                                 "a series with more in the range comes as (points - 1) "
                                 "// 2 equal step ranges, each its lowest and highest "
                                 "value at their steps (a step of it with null where "
                                 "none is finite), then the range's newest point")])
@api_view(["GET"])
def metrics(request, run_id: int):
    target = get_object_or_404(Run, pk=run_id)
    names = request.query_params.getlist("name")
    if not names:
        raise ValidationError({"name": "name at least one metric, e.g. ?name=reward/mean "
                                       "(GET .../metric-names lists them)"})
    start = int_param(request, "start")
    end = int_param(request, "end")
    points = int_param(request, "points", 500, 1, MAX_POINTS)
    series = {name: {"steps": [step for step, _ in pts], "values": [v for _, v in pts]}
              for name, pts in history.series(target, names, start, end, points).items()}
    return Response({"series": series})


@extend_schema(responses={200: OpenApiTypes.OBJECT})
@api_view(["GET"])
def metric_names(request, run_id: int):
    target = get_object_or_404(Run, pk=run_id)
    names = set(stored_metric_names(target.pk))
    names |= set(MetricRollup.objects.filter(run=target, width=TIERS[-1])
                 .values_list("name", flat=True))
    return Response({"names": sorted(names)})


@extend_schema(
    responses=s.EventsSerializer,
    parameters=[OpenApiParameter("after_seq", integers(), description="events after this "
                                                                  "seq (default 0)"),
                OpenApiParameter("type", str, many=True, description="only these types"),
                OpenApiParameter("limit", integers(1, MAX_LIMIT), description="default 500")])
@api_view(["GET"])
def events(request, run_id: int):
    target = get_object_or_404(Run, pk=run_id)
    after = int_param(request, "after_seq", 0)
    limit = int_param(request, "limit", 500, 1, MAX_LIMIT)
    rows = RunEvent.backfill(target, after)
    types = request.query_params.getlist("type")
    if types:
        rows = rows.filter(type__in=types)
    payloads = list(rows.values_list("seq", "payload")[:limit])
    last_seq = payloads[-1][0] if payloads else after
    return Response({"events": [p for _, p in payloads], "last_seq": last_seq})


@extend_schema(
    responses=s.JobLogSerializer,
    parameters=[OpenApiParameter("after_line", int), OpenApiParameter("limit", int)])
@api_view(["GET"])
def job_log(request, run_id: int):
    """A launched command's output, as its run's log panel shows it: its Ray job's log
    lines, numbered from the log's start (lines a burst skipped or retention dropped are
    absent). Empty for a run with no command."""
    target = get_object_or_404(Run, pk=run_id)
    after = int_param(request, "after_line", 0)
    limit = int_param(request, "limit", 500, 1, MAX_LIMIT)
    rows = job_log_lines(target, after).values_list("seq", "ts", "payload")[:limit]
    lines = [{"line": -seq, "ts": ts, "message": payload["message"]} for seq, ts, payload in rows]
    return Response({"lines": lines, "last_line": lines[-1]["line"] if lines else after})


@extend_schema(responses=s.CheckpointSerializer(many=True))
@api_view(["GET"])
def checkpoints(request, run_id: int):
    target = get_object_or_404(Run, pk=run_id)
    return Response(s.CheckpointSerializer(target.checkpoints.order_by("step"), many=True).data)


@extend_schema(methods=["GET"], responses=s.ControlSerializer(many=True))
@extend_schema(methods=["POST"], request=s.ControlRequestSerializer,
               responses={201: s.ControlSerializer, 400: s.ErrorSerializer,
                          409: s.ErrorSerializer})
@api_view(["GET", "POST"])
def controls(request, run_id: int):
    target = get_object_or_404(Run, pk=run_id)
    if request.method == "POST":
        data = valid(s.ControlRequestSerializer, request)
        if data.get("value") is None:
            data.pop("value", None)
        row = do_request_control(request.user, target, validate_control(data))
        return Response(s.ControlSerializer(row).data, status=status.HTTP_201_CREATED)
    rows = target.controls.select_related("requested_by").order_by("id")
    return Response(s.ControlSerializer(rows, many=True).data)
