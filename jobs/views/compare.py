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

from jobs import charts
from jobs.compare import (
    SUMMARY_FIELDS,
    SUMMARY_METRICS,
    CompareError,
    config_differences,
    parse_ids,
    parse_level,
    since_start,
    summarize,
)
from jobs.models import Run
from jobs.planning import plan_for_run, predicted_vs_measured
from jobs.views import run_page


def selected_runs(ids: list[int]) -> list[Run]:
    """The runs, in the order asked; CompareError naming any id that is no run."""
    by_id = Run.objects.in_bulk(ids)
    missing = [str(pk) for pk in ids if pk not in by_id]
    if missing:
        raise CompareError(f"ids: no run {', '.join(missing)}; pick runs from the runs list")
    return [by_id[pk] for pk in ids]


def compare_data(runs: list[Run], level: float | None) -> dict:
    """What the page draws and the JSON endpoint returns: per run its summary row, the
    config keys that differ, and the overlaid charts."""
    names = {name for name, _ in charts.COMPARE_METRICS} | set(SUMMARY_METRICS)
    loaded = []
    with run_page.snapshot():
        for run in runs:
            loaded.append((run, run_page.metric_series(run, names),
                           since_start(run_page.step_times(run))))
    differences = config_differences([run.config for run, _, _ in loaded])
    return {
        "level": level,
        "runs": [{"id": run.pk, "name": run.name, "status": run.status,
                  "parent_id": run.parent_id, "summary": summarize(series, wall, level)}
                 for run, series, wall in loaded],
        "config_diff": [{"key": key, "values": values} for key, values in differences],
        "charts": charts.compare_figures([(f"#{run.pk} {run.name}", series, wall)
                                          for run, series, wall in loaded]),
    }


def selection(request) -> tuple[list[Run], float | None]:
    return selected_runs(parse_ids(request.GET.getlist("ids"))), \
        parse_level(request.GET.get("level"))


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
