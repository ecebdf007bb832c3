"""The read-only pages. Each view serves its full page, or only its live part when htmx
asks (the polling fallback and in-page refreshes)."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_GET

from jobs.alerts.views import run_alerts, run_coverage, run_health
from jobs.auth import is_operator
from jobs.models import Run
from jobs.models.controls import display_status
from jobs.queries import run_page


@require_GET
@login_required
def run_detail(request, run_id: int):
    run = get_object_or_404(Run, pk=run_id)
    context = {
        "run": run,
        "logs": run_page.recent_logs(run),
        "checkpoints": run.checkpoints.order_by("step"),
        "alerts": run_alerts(run),
        "config_toml": run_page.config_toml(run),
        "facts": run_page.run_facts(run),
        "operator": is_operator(request.user),
        "stop_url": reverse("run-stop", args=[run.pk]),
        "fork_url": reverse("run-fork", args=[run.pk]),
        "control_url": reverse("run-control", args=[run.pk]),
        "controls": run.controls.select_related("requested_by").order_by("-id")[:50],
        "shown_status": display_status(run),
        "current_lr": run_page.current_lr(run),
        "rollout_workers": run_page.rollout_workers(run),
        "progress": run_page.run_progress(run),
    }
    if request.htmx:
        return render(request, "jobs/_run_panels.html", context)
    context["coverage"] = run_coverage(run)
    context["health"] = run_health(run)
    context["data"] = {**run_page.chart_data(run), "progress": context["progress"]["clock"]}
    return render(request, "jobs/run_detail.html", context)
