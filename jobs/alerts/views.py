"""Alert pages: the list across runs (filter by state, kind, run) and the operator's
acknowledge / resolve buttons. Each answers htmx with its fragment, else a full page or
a redirect back."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from jobs.alerts.rules import KINDS
from jobs.auth import is_operator, operator_required
from jobs.models import Alert, AlertState, Preset
from jobs.models.validators import parse_pk

PAGE_SIZE = 200
RUN_PAGE_RESOLVED = 20  # resolved alerts the run page keeps under the unresolved ones


def run_alerts(run) -> list[Alert]:
    """The run page's panel: every unresolved alert, then the latest resolved ones."""
    alerts = Alert.objects.filter(run=run)
    return [*alerts.exclude(state=AlertState.RESOLVED),
            *alerts.filter(state=AlertState.RESOLVED)[:RUN_PAGE_RESOLVED]]


@require_GET
@login_required
def alerts_page(request):
    state, kind, run_id = (request.GET.get(k, "") for k in ("state", "kind", "run"))
    alerts = Alert.objects.select_related("run")
    if state in AlertState.values:
        alerts = alerts.filter(state=state)
    if kind in KINDS:
        alerts = alerts.filter(kind=kind)
    if (pk := parse_pk(run_id)) is not None:
        alerts = alerts.filter(run_id=pk)
    context = {"alerts": alerts[:PAGE_SIZE], "operator": is_operator(request.user),
               "states": AlertState.choices, "kinds": KINDS, "state": state, "kind": kind,
               "run_id": run_id, "presets": Preset.objects.all()}
    if request.htmx:
        return render(request, "jobs/alerts/_alerts_list.html", context)
    return render(request, "jobs/alerts/alerts.html", context)


@require_POST
@operator_required
def alert_change(request, alert_id: int, change):
    """Acknowledge or resolve (``change`` is do_acknowledge or do_resolve, from urls)."""
    alert = get_object_or_404(Alert, pk=alert_id)
    change(alert, request.user)
    alert.refresh_from_db()
    if request.htmx:
        return render(request, "jobs/alerts/_alert.html", {"alert": alert, "operator": True})
    return redirect("run-detail", alert.run_id)
