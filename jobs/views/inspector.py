"""The rollout inspector page: /runs/<id>/samples. It draws the latest sampled step from
its json_script, then asks /api/v1/runs/<id>/samples (jobs.rest.samples) for each step and
filter the operator picks; the run's socket announces each new sampled step."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_GET

from jobs.models import TERMINAL, Run, RunEvent
from jobs.queries.inspector import SampleFilters, step_view
from jobs.queries.run_page import snapshot


@require_GET
@login_required
def run_samples(request, run_id: int):
    run = get_object_or_404(Run, pk=run_id)
    with snapshot():
        last_seq = RunEvent.highest_seq(run)
        view = step_view(run, None, SampleFilters())
    data = {**view, "last_seq": last_seq, "ws_path": f"/ws/runs/{run.pk}/",
            "api_url": reverse("api-run-samples", args=[run.pk]),
            "live": run.status not in TERMINAL}
    return render(request, "jobs/samples.html", {"run": run, "view": view, "data": data})
