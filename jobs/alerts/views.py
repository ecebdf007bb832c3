"""Alert pages: the list across runs (filter by state, kind, run) and the operator's
acknowledge / resolve buttons. Each answers htmx with its fragment, else a full page or
a redirect back."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.views.decorators.http import require_GET, require_POST

from engine.config import FRAMEWORK_LABELS
from jobs.alerts.coverage import coverage
from jobs.alerts.health import strip
from jobs.alerts.history import RunFacts
from jobs.alerts.recent import read
from jobs.alerts.rules import KINDS
from jobs.auth import is_operator, operator_required
from jobs.models import LIVE, Alert, AlertState, Preset, Run
from jobs.models.controls import display_status
from jobs.models.validators import parse_pk

PAGE_SIZE = 200
RUN_PAGE_RESOLVED = 20  # resolved alerts the run page keeps under the unresolved ones
COVERAGE_RUNS = 10      # live external runs whose unevaluated rules the alerts page lists


def run_alerts(run) -> list[Alert]:
    """The run page's panel: every unresolved alert, then the latest resolved ones."""
    alerts = Alert.objects.filter(run=run)
    return [*alerts.exclude(state=AlertState.RESOLVED),
            *alerts.filter(state=AlertState.RESOLVED)[:RUN_PAGE_RESOLVED]]


def run_coverage(run: Run) -> dict | None:
    """The "not evaluated" panel of an external run: each rule its history cannot feed,
    the canonical names it needs and the framework's own names for them. None on a native
    run: rlplane's engine reports every input the rules read."""
    if not run.is_external:
        return None
    _, gaps = coverage(read(run).history, RunFacts.of(run, display_status(run)))

    def names(canonical: tuple[str, ...], to_log: dict) -> list[dict]:
        return [{"name": n, "theirs": [x for x in to_log.get(n, []) if x != n]}
                for n in canonical]
    return {"run": run, "label": FRAMEWORK_LABELS.get(run.framework, run.framework),
            "total": len(KINDS), "count": len(gaps),
            "gaps": [{"kind": g.kind, "metrics": names(g.metrics, g.to_log),
                      "any_of": names(g.any_of, g.to_log), "other": g.other}
                     for g in gaps if not g.engine_only],
            "engine_only": [g.kind for g in gaps if g.engine_only]}


def run_health(run: Run) -> list:
    """The health strip's lines (jobs/alerts/health.py): what the last evaluation checked
    (Run.rules_checked, stored by the lifecycle) and the run's live alerts."""
    live = Alert.objects.filter(run=run).exclude(state=AlertState.RESOLVED)
    return strip(run.rules_checked, live.values_list("kind", "state"))


def render_health(run: Run) -> str:
    """The strip as the page shows it, for the websocket to swap in (id run-health)."""
    return render_to_string("jobs/alerts/_health_strip.html",
                            {"health": run_health(run), "run": run})


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
    # The filtered run, else the live runs another framework trains: what no rule watches
    runs = (Run.objects.filter(pk=pk) if pk is not None else
            Run.objects.filter(status__in=LIVE, config__has_key="framework")
            .order_by("-pk")[:COVERAGE_RUNS])
    context["coverages"] = [c for c in map(run_coverage, runs) if c and c["count"]]
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
