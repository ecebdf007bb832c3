"""Run compare: 2-6 runs side by side. The URL holds the selection, so it can be shared.

    GET /runs/compare?ids=3,7[&level=0.5]      the page: overlaid charts (step or wall
                                               time), the summary table, the config diff,
                                               the planner's table fitted from the first
                                               run and the others' measurements against it
    GET /api/runs/compare?ids=3,7[&level=0.5]  the same data as JSON: the REST API's view
                                               (jobs/rest/runs.py compare), also at
                                               /api/v1/runs/compare

``?ids=3&ids=7`` (the runs list's checkboxes) is redirected to ``?ids=3,7``.
"""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET

from jobs.queries.compare import SUMMARY_FIELDS, CompareError, compare_data, selection
from jobs.queries.planning import plan_for_run, predicted_vs_measured


@require_GET
@login_required
def compare_page(request):
    if len(request.GET.getlist("ids")) > 1:
        query = request.GET.copy()
        query["ids"] = ",".join(request.GET.getlist("ids"))
        return redirect(f"{request.path}?{query.urlencode(safe=',')}")
    try:
        runs, level = selection(request)
    except CompareError as exc:
        return render(request, "jobs/compare.html", {"error": str(exc)}, status=400)
    data = compare_data(runs, level)
    rows = [(label, [r["summary"][key] for r in data["runs"]])
            for key, label in SUMMARY_FIELDS.items()]
    plan, plan_error = plan_for_run(runs[0])     # the baseline: the first run asked for
    checks = predicted_vs_measured(plan, runs[0], runs[1:]) if plan else []
    return render(request, "jobs/compare.html", {
        "data": data, "runs": runs, "summary_rows": rows, "plan": plan,
        "plan_error": plan_error, "plan_checks": checks,
        "level": request.GET.get("level", ""), "ids": ",".join(str(r.pk) for r in runs)})
