"""Operator pages that change runs: new run, stop, fork.

    GET  /runs/new[?preset=ID]           the run form, from a preset (or the defaults)
    POST /runs/new                       valid -> do_launch_run -> the run page
    POST /runs/new, htmx, validate=1     the Validate button: the errors at their TOML
                                         lines, or the placement preview; nothing saved
    POST /runs/<id>/stop                 do_stop_run -> the run page (a queued run: cancelled)
    POST /runs/<id>/priority             do_set_priority (a queued run) -> the run page
    POST /runs/<id>/baseline             {baseline_run | clear}: do_set_baseline, the run
                                         ThroughputRegression compares with -> the run page
    POST /runs/<id>/controls             {kind, value?}: do_request_control (a live
                                         control of a running run) -> the run page
    GET  /runs/<id>/fork[?checkpoint=ID] the run form from the parent's config
    POST /runs/<id>/fork                 valid -> the diff against the parent; posted again
                                         unchanged -> do_fork_run -> the fork's page
    POST /runs/<id>/fork, htmx, validate=1   as for a new run
"""

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from engine.api import ControlError, placement_bundles, validate_control
from engine.config import RunConfig, validate_config
from jobs.alerts.lifecycle import BaselineProblem, do_set_baseline
from jobs.auth import operator_required
from jobs.models import Checkpoint, InvalidTransition, NotNative, Preset, Run
from jobs.models.validators import parse_pk
from jobs.queries.planning import plan_for_run
from jobs.runs.actions import (
    Refused,
    do_fork_run,
    do_launch_run,
    do_request_control,
    do_set_priority,
    do_stop_run,
)
from jobs.runs.forms import ForkForm, RunConfigForm, initial_for
from jobs.runs.queue import demand_of, fits_now


def placement_preview(cfg: RunConfig) -> dict:
    """What the run will ask the cluster for, and whether the cluster can hold it now."""
    bundles = placement_bundles(cfg)
    asked = demand_of(cfg)
    if bundles:
        devices = sum(b.get("GPU", 0.0) for b in bundles)
        shape = " + ".join(f"{b.get('GPU', 0.0):g}" for b in bundles)
        what = (f"a Ray placement group of {len(bundles)} bundle{'s' * (len(bundles) != 1)} "
                f"({shape} GPUs, {cfg.placement.strategy}): {devices:g} devices")
    else:
        what = (f"no Ray placement group: one in-process run slot, "
                f"{cfg.placement.devices} logical device{'s' * (cfg.placement.devices != 1)}")
    fits, why = fits_now(asked)
    return {"what": what, "bundles": len(bundles), "fits": fits, "why": why,
            "algorithm": cfg.algorithm.type, "placement": cfg.placement.type,
            "async_policy": cfg.async_policy.type}


def validation(request, form):
    """The Validate button's fragment: the form's errors at their lines, or the preview."""
    preview = placement_preview(form.run_config) if form.is_valid() else None
    return render(request, "jobs/launch/_validation.html", {"form": form, "preview": preview})


@operator_required
@require_http_methods(["GET", "POST"])
def run_new(request):
    presets = Preset.objects.all()
    preset = None
    if request.method == "POST":
        form = RunConfigForm(request.POST)
        if request.htmx and request.POST.get("validate"):
            return validation(request, form)
        if form.is_valid():
            try:
                run = do_launch_run(request.user, form.run_config.name, form.config_data())
            except Refused as exc:
                form.refuse(exc)
            else:
                return redirect("run-detail", run_id=run.pk)
    else:
        preset_id = parse_pk(request.GET.get("preset", ""))
        if preset_id is not None:
            preset = get_object_or_404(Preset, pk=preset_id)
        cfg = validate_config(preset.config) if preset else RunConfig()
        form = RunConfigForm(initial=initial_for(cfg))
    return render(request, "jobs/launch/new.html",
                  {"form": form, "presets": presets, "preset": preset})


@operator_required
@require_POST
def run_stop(request, run_id: int):
    run = get_object_or_404(Run, pk=run_id)
    was_queued = run.status == "queued"
    try:
        do_stop_run(request.user, run)
    except InvalidTransition as exc:
        messages.error(request, f"Not stopped: {exc}")
    else:
        messages.info(request, "Cancelled: the run left the queue without starting."
                      if was_queued else "Stop requested: the driver checkpoints after the "
                                         "step in progress, then exits.")
    return redirect("run-detail", run_id=run.pk)


@operator_required
@require_POST
def run_priority(request, run_id: int):
    run = get_object_or_404(Run, pk=run_id)
    try:
        do_set_priority(request.user, run, int(request.POST.get("priority", "")))
    except ValueError:
        messages.error(request, "Priority must be a whole number (higher starts first).")
    except Refused as exc:
        messages.error(request, f"Priority not changed: {exc}")
    else:
        messages.info(request, f"Priority set to {run.priority}.")
    return redirect("run-detail", run_id=run.pk)


@operator_required
@require_POST
def run_baseline(request, run_id: int):
    run = get_object_or_404(Run, pk=run_id)
    raw = request.POST.get("baseline_run", "").strip()
    baseline_id = None if request.POST.get("clear") else parse_pk(raw)
    if baseline_id is None and not request.POST.get("clear"):
        messages.error(request, f"Baseline not changed: baseline_run must be a run id, got "
                                f"{raw!r}.")
        return redirect("run-detail", run_id=run.pk)
    try:
        do_set_baseline(request.user, run, baseline_id)
    except BaselineProblem as exc:
        messages.error(request, f"Baseline not changed: {exc}.")
    else:
        messages.info(request, f"Throughput baseline: run #{baseline_id}." if baseline_id
                      else "Throughput baseline cleared: back to the default.")
    return redirect("run-detail", run_id=run.pk)


@operator_required
@require_POST
def run_control(request, run_id: int):
    run = get_object_or_404(Run, pk=run_id)
    data = {"kind": request.POST.get("kind", "")}
    if request.POST.get("value", "").strip():
        data["value"] = request.POST["value"].strip()
    try:
        row = do_request_control(request.user, run, validate_control(data))
    except (ControlError, Refused) as exc:
        messages.error(request, f"Not sent: {exc}")
    else:
        messages.info(request, f"Sent {row.label}: the run applies it after the step in "
                               "progress.")
    return redirect("run-detail", run_id=run.pk)


@operator_required
@require_http_methods(["GET", "POST"])
def run_fork(request, run_id: int):
    parent = get_object_or_404(Run, pk=run_id)
    if parent.is_external:
        return render(request, "jobs/launch/fork.html",
                      {"parent": parent, "form": None,
                       "not_native": str(NotNative(parent, "a fork"))}, status=409)
    if not Checkpoint.forkable(parent).exists():
        return render(request, "jobs/launch/fork.html", {"parent": parent, "form": None},
                      status=409)
    diff = fork_plan = None
    if request.method == "POST":
        form = ForkForm(parent, request.POST)
        if request.htmx and request.POST.get("validate"):
            return validation(request, form)
        if form.is_valid():
            if form.is_reviewed():
                try:
                    run = do_fork_run(request.user, parent, form.cleaned_data["checkpoint"],
                                      form.config_data())
                except Refused as exc:
                    form.refuse(exc)
                else:
                    return redirect("run-detail", run_id=run.pk)
        if form.is_valid():
            diff, fork_plan = form.diff(), form.plan()
            data = request.POST.copy()
            data["reviewed"] = form.digest()  # the next submit launches this config
            form = ForkForm(parent, data)
            form.is_valid()
    else:
        checkpoints = Checkpoint.forkable(parent)
        wanted = parse_pk(request.GET.get("checkpoint", ""))
        chosen = checkpoints.filter(pk=wanted).first() if wanted is not None else None
        chosen = chosen or checkpoints.first()
        cfg = parent.fork_config(chosen.step)
        form = ForkForm(parent, initial={**initial_for(cfg), "checkpoint": chosen})
    plan, plan_error = plan_for_run(parent)
    return render(request, "jobs/launch/fork.html",
                  {"parent": parent, "form": form, "diff": diff, "fork_plan": fork_plan,
                   "plan": plan,
                   "plan_error": plan_error})
