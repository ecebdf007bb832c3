"""Alerts, presets and the cluster over HTTP.

    GET  /api/v1/alerts                    ?state= &kind= &run= &limit=
    POST /api/v1/alerts/<id>/acknowledge   open -> acknowledged
    POST /api/v1/alerts/<id>/resolve       open | acknowledged -> resolved
    GET  /api/v1/presets, /api/v1/presets/<id>
    GET  /api/v1/cluster                   jobs.cluster.status's view + the queue
"""

from __future__ import annotations

import dataclasses

from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.decorators import api_view
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from jobs.alerts.lifecycle import do_acknowledge, do_resolve
from jobs.alerts.rules import KINDS
from jobs.cluster import status as cluster_info
from jobs.models import Alert, AlertState, Preset, Run, RunStatus
from jobs.rest import serializers as s
from jobs.rest.runs import MAX_LIMIT, int_param, integers


@extend_schema(responses=s.AlertSerializer(many=True),
               parameters=[OpenApiParameter("state", str, enum=list(AlertState.values)),
                           OpenApiParameter("kind", str, enum=list(KINDS)),
                           OpenApiParameter("run", integers(), description="a run id"),
                           OpenApiParameter("limit", integers(1, MAX_LIMIT),
                                            description="default 200")])
@api_view(["GET"])
def alerts(request):
    rows = Alert.objects.select_related("run")
    state, kind = request.query_params.get("state"), request.query_params.get("kind")
    if state is not None:
        if state not in AlertState.values:
            raise ValidationError({"state": f"one of {', '.join(AlertState.values)}"})
        rows = rows.filter(state=state)
    if kind is not None:
        if kind not in KINDS:
            raise ValidationError({"kind": f"one of {', '.join(KINDS)}"})
        rows = rows.filter(kind=kind)
    run_id = int_param(request, "run")
    if run_id is not None:
        rows = rows.filter(run_id=run_id)
    limit = int_param(request, "limit", 200, 1, MAX_LIMIT)
    return Response(s.AlertSerializer(rows[:limit], many=True).data)


def alert_change(request, alert_id: int, change) -> Response:
    alert = get_object_or_404(Alert, pk=alert_id)
    change(alert, request.user)
    alert.refresh_from_db()
    return Response(s.AlertSerializer(alert).data)


@extend_schema(request=None, responses=s.AlertSerializer)
@api_view(["POST"])
def acknowledge(request, alert_id: int):
    return alert_change(request, alert_id, do_acknowledge)


@extend_schema(request=None, responses=s.AlertSerializer)
@api_view(["POST"])
def resolve(request, alert_id: int):
    return alert_change(request, alert_id, do_resolve)


@extend_schema(responses=s.PresetSerializer(many=True))
@api_view(["GET"])
def presets(request):
    return Response(s.PresetSerializer(Preset.objects.all(), many=True).data)


@extend_schema(responses=s.PresetSerializer)
@api_view(["GET"])
def preset(request, preset_id: int):
    return Response(s.PresetSerializer(get_object_or_404(Preset, pk=preset_id)).data)


@extend_schema(responses={200: OpenApiTypes.OBJECT})
@api_view(["GET"])
def cluster(request):
    """The cluster page's view (nodes, resources, which runs hold what) and the queue."""
    view = cluster_info.cluster_view()
    queued = Run.objects.filter(status=RunStatus.QUEUED).order_by("-priority", "created_at",
                                                                  "id")
    return Response({
        **dataclasses.asdict(view),
        "queue": [{"id": r.pk, "name": r.name, "priority": r.priority,
                   "reason": r.status_reason} for r in queued],
    })
