"""The cluster page: Ray nodes, their resources, which runs hold what, utilization, and
the embedded stack's processes and their restarts.
htmx polls the same view for its live part every few seconds."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.http import require_GET

from jobs.cluster import status as cluster
from jobs.cluster.stack import stack_view

POLL_S = 3


@require_GET
@login_required
def cluster_page(request):
    view = cluster.cluster_view()
    context = {"cluster": view, "utilization": cluster.utilization(),
               "stack": stack_view(), "poll_s": POLL_S}
    if request.htmx:
        return render(request, "jobs/_cluster_panels.html", context)
    return render(request, "jobs/cluster.html", context)
