"""The runs list, its filters, and the operator's archive / restore / delete.

    GET  /?status=running&name=grpo&config=placement.type=colocated&archived=1&page=2
                               the list (htmx: only the table), newest first, RUNS_PAGE
                               a page; archived runs only with archived=1; a bad filter
                               is named above the table
    POST /runs/<id>/archive    a finished run leaves the list     -> the run page
    POST /runs/<id>/restore    back on the list                   -> the run page
    POST /runs/<id>/delete     a finished run's rows and files    -> the runs list
"""

from __future__ import annotations

import json
import re

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db.models.fields.json import KeyTransform
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from engine.config import RunConfig
from jobs.auth import is_operator, operator_required
from jobs.models import Run, RunStatus
from jobs.queries import run_page
from jobs.runs.actions import Refused, do_archive_run, do_delete_run, do_restore_run

CONFIG_KEY = re.compile(r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)*$")


class FilterError(ValueError):
    """A filter the list cannot apply; the message names the field and the fix."""


def config_value_filter(runs, text: str):
    """``runs`` whose config has ``placement.type=colocated``. The value is read as JSON
    where it is (numbers, true/false), else taken as a string. Each dotted part is a key,
    never a lookup: ``placement.contains=x`` asks for a key named "contains"."""
    key, sep, raw = text.partition("=")
    key, raw = key.strip(), raw.strip()
    if not sep or not CONFIG_KEY.match(key) or not raw:
        raise FilterError("config: write key=value with a dotted config key, e.g. "
                          "placement.type=colocated or async_policy.max_staleness=2")
    # an external run's keys too: framework=verl, params.learning_rate=1e-6
    roots = [*RunConfig.model_fields, "framework", "params"]
    if key.split(".")[0] not in roots:
        raise FilterError(f"config: {key.split('.')[0]!r} is no config section; one of "
                          f"{', '.join(roots)}")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    path = "config"
    for part in key.split("."):
        path = KeyTransform(part, path)
    return runs.alias(config_value=path).filter(config_value=value)


def filtered_runs(params) -> tuple:
    """The runs the list shows for these query parameters, and the filter values."""
    chosen = {k: params.get(k, "").strip() for k in ("status", "name", "config")}
    chosen["archived"] = params.get("archived", "") == "1"
    runs = Run.objects.all() if chosen["archived"] else Run.objects.filter(archived_at=None)
    if chosen["status"]:
        if chosen["status"] not in RunStatus.values:
            raise FilterError(f"status: {chosen['status']!r} is no status; one of "
                              f"{', '.join(RunStatus.values)}")
        runs = runs.filter(status=chosen["status"])
    if chosen["name"]:
        runs = runs.filter(name__icontains=chosen["name"])
    if chosen["config"]:
        runs = config_value_filter(runs, chosen["config"])
    return runs, chosen


# Newest first, this many a page: rendering a row costs ~0.3 ms, so 1,000 runs on one page
# took over 300 ms (bench/history.py).
RUNS_PAGE = 200


def page_number(text: str | None) -> int:
    """?page=N (1 when absent or not a positive number: a stale link still lists runs)."""
    try:
        return max(1, int(text or 1))
    except ValueError:
        return 1


@require_GET
@login_required
def index(request):
    """The runs list."""
    try:
        runs, chosen = filtered_runs(request.GET)
        error = ""
    except FilterError as exc:
        runs, chosen, error = Run.objects.none(), {}, str(exc)
    page = page_number(request.GET.get("page"))
    shown = list(run_page.runs_with_latest_metrics(runs)[
        (page - 1) * RUNS_PAGE:page * RUNS_PAGE + 1])
    older = None
    if len(shown) > RUNS_PAGE:
        shown = shown[:RUNS_PAGE]
        query = request.GET.copy()
        query["page"] = str(page + 1)
        older = "?" + query.urlencode()
    context = {"runs": shown, "filters": chosen, "older_url": older,
               "filter_error": error, "statuses": RunStatus.values}
    if request.htmx:
        return render(request, "jobs/_runs_table.html", context)
    context["operator"] = is_operator(request.user)
    return render(request, "jobs/index.html", context)


def run_action(request, run_id: int, action, done: str, then: str = "run-detail"):
    """``action(user, run)``; refused: back to the run page, saying why; done: ``then``."""
    run = get_object_or_404(Run, pk=run_id)
    try:
        action(request.user, run)
    except Refused as exc:
        messages.error(request, f"Not done: {exc}")
        return redirect("run-detail", run_id=run.pk)
    messages.info(request, done.format(run=run))
    return redirect("index") if then == "index" else redirect(then, run_id=run.pk)


@operator_required
@require_POST
def run_archive(request, run_id: int):
    return run_action(request, run_id, do_archive_run, "Archived: run #{run.pk} is off the "
                      "runs list (its \"show archived\" filter lists it).")


@operator_required
@require_POST
def run_restore(request, run_id: int):
    return run_action(request, run_id, do_restore_run,
                      "Restored: run #{run.pk} is back on the runs list.")


@operator_required
@require_POST
def run_delete(request, run_id: int):
    return run_action(request, run_id, do_delete_run,
                      "Deleted run #{run.pk} ({run.name}): its rows and its files.", "index")
