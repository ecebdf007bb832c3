"""Findings -> Alert rows, as events arrive (ingest) and periodically (beat).

    do_evaluate_alerts(run)      history from RunEvents (recent.py: the new ones since
                                 this process last evaluated the run) and the throughput
                                 baseline (the run an operator marked, else a fork's
                                 parent's, else the run's own first steps: baseline_for)
                                 -> rules.evaluate -> rows, and what it checked
                                 (coverage.checked) -> Run.rules_checked:
        new key                   -> Alert(open) + a Notification per channel ("open")
        key already unresolved    -> evidence, cause and last_step refreshed (one row)
        unresolved key not found  -> resolved "the condition cleared" + "resolved" notices
        the run ended (succeeded, stopped, failed) -> every unresolved one resolved "the run
                                    ended": its condition can no longer clear (a lost
                                    run's RunLost stays open: someone must look)
    on commit: the changed alerts go to the run page's group; notifications to the worker

The caller holds the run's row lock (ingest does; the periodic task takes it), so two
evaluations of one run never race to open the same key.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from functools import partial

from django.db import transaction
from django.urls import reverse

from engine.api import metrics as M
from jobs.alerts.coverage import checked
from jobs.alerts.delivery import deliver_notification
from jobs.alerts.history import (
    Baseline,
    Finding,
    RunFacts,
    RunHistory,
    Thresholds,
)
from jobs.alerts.recent import recent_history
from jobs.alerts.rules import evaluate
from jobs.alerts.throughput import baseline_of, first_healthy
from jobs.groups import group_send, run_group
from jobs.models import (
    LIVE_STATES,
    Alert,
    AlertChannel,
    AlertState,
    Notification,
    Preset,
    Run,
    RunEvent,
    RunStatus,
)
from jobs.models.controls import display_status

# A run over for good: its alerts are closed with it. Not LOST (RunLost is about it).
ENDED = frozenset({RunStatus.SUCCEEDED, RunStatus.STOPPED, RunStatus.FAILED})

logger = logging.getLogger(__name__)


def thresholds_for(run: Run) -> Thresholds:
    """The preset's overrides (the preset named like the run's config), else defaults."""
    overrides = (Preset.objects.filter(name=run.config.get("name"))
                 .values_list("alert_thresholds", flat=True).first())
    return Thresholds(**overrides) if overrides is not None else Thresholds()


def do_evaluate_alerts(run: Run, now: float | None = None) -> list[Alert]:
    """Open, refresh and resolve the run's alerts from its history; returns the alerts
    whose state changed."""
    # "paused" while the driver holds: a paused run makes no progress on purpose
    thresholds = thresholds_for(run)
    facts = RunFacts.of(run, display_status(run))
    facts = dataclasses.replace(facts, baseline=baseline_for(run, thresholds))
    history = recent_history(run)
    findings = evaluate(history, facts, thresholds, time.time() if now is None else now)
    rules_checked = checked(history, facts)
    if rules_checked != run.rules_checked:   # a new step, mostly: one small UPDATE
        run.rules_checked = rules_checked
        Run.objects.filter(pk=run.pk).update(rules_checked=rules_checked)
    return do_apply_findings(run, findings)


def baseline_for(run: Run, t: Thresholds) -> Baseline | None:
    """ThroughputRegression's baseline: the run an operator marked (Run.baseline_run),
    else a fork's parent's, else the run's own first steps as stored. A marked run
    whose timed steps are gone (deleted events) falls through to the next."""
    if run.baseline_run_id is not None:
        marked = stored_baseline(run.baseline_run, t,
                                 f"the marked baseline, run #{run.baseline_run_id}'s")
        if marked is not None:
            return marked
    if run.parent_id is not None:
        return stored_baseline(run.parent, t, f"run #{run.parent_id}'s")
    return own_baseline(run, t)


class BaselineProblem(ValueError):
    """Why a run cannot be marked as another's baseline; ``field`` names the input."""
    field = "baseline_run"


def check_baseline(run: Run, baseline_id: int | None) -> Run | None:
    """The run with pk ``baseline_id`` if it can be ``run``'s throughput baseline (None
    clears the mark); else BaselineProblem saying why: the run itself, no such run, or
    one with no timed steps past its first (its samples/s and step time) to compare with."""
    if baseline_id is None:
        return None
    if baseline_id == run.pk:
        raise BaselineProblem(f"run #{run.pk} cannot be its own baseline; name another "
                              "run, or clear the mark (its own first steps are the default)")
    baseline = Run.objects.filter(pk=baseline_id).first()
    if baseline is None:
        raise BaselineProblem(f"there is no run #{baseline_id}")
    t = thresholds_for(run)
    if stored_baseline(baseline, t, "") is None:
        raise BaselineProblem(
            f"run #{baseline_id} has no timed steps to compare with: a baseline needs steps "
            f"after its first that report {M.THROUGHPUT_SAMPLES_PER_S} and {M.TIME_STEP_S}")
    return baseline


def do_set_baseline(user, run: Run, baseline_id: int | None) -> None:
    """Mark run ``baseline_id`` as ``run``'s throughput baseline (None: clear it);
    BaselineProblem for a bad one. The next evaluation compares against it."""
    baseline = check_baseline(run, baseline_id)
    Run.objects.filter(pk=run.pk).update(baseline_run=baseline)
    run.baseline_run = baseline
    logger.info("run %s: throughput baseline %s set by %s", run.pk,
                f"#{baseline_id}" if baseline else "cleared", user)


def stored_baseline(run: Run, t: Thresholds, whose: str) -> Baseline | None:
    """ThroughputRegression's baseline from ``run``'s first healthy steps as stored (a
    few metrics events from its start: one small query), for a marked run or a fork's
    parent (the run itself: own_baseline, which keeps it). The history the rules see holds
    only the last few thousand events (recent.py): on a long run its first steps are long
    gone, and a baseline taken there would creep."""
    return baseline_from(first_metrics(run, t), t, whose)


def baseline_rows(t: Thresholds) -> int:
    """How many of a run's first metrics events a baseline may read."""
    return 2 * (t.throughput_baseline_steps + 1)


def first_metrics(run: Run, t: Thresholds) -> list[dict]:
    """The payloads of the run's first baseline_rows metrics events."""
    return list(RunEvent.objects.filter(run=run, type="metrics.append").order_by("seq")
                .values_list("payload", flat=True)[:baseline_rows(t)])


def baseline_from(rows: list[dict], t: Thresholds, whose: str) -> Baseline | None:
    h = RunHistory.of(rows)
    steps = first_healthy(h, t)
    if not steps:
        return None
    return baseline_of(h, steps, f"{whose} steps {steps[0]}-{steps[-1]}")


# Runs' own baselines once every row a baseline may read (first_metrics) is stored:
# {(run, created_at, history_rewrites, thresholds): Baseline or None}. Those rows change no
# more through ingest (a later event comes after them; one stored below the run's highest
# seq bumps history_rewrites), so an evaluation, about one a batch, reads and decodes them
# once per process rather than every time. Kept when the evaluation's transaction commits:
# rows read in one that rolls back may never be stored.
OWN_BASELINES: dict[tuple, Baseline | None] = {}
OWN_BASELINES_KEPT = 10_000
UNKNOWN = object()


def own_baseline(run: Run, t: Thresholds) -> Baseline | None:
    """stored_baseline of the run itself, kept (OWN_BASELINES)."""
    key = (run.pk, run.created_at, run.history_rewrites, t)
    if (kept := OWN_BASELINES.get(key, UNKNOWN)) is not UNKNOWN:
        return kept
    rows = first_metrics(run, t)
    baseline = baseline_from(rows, t, "this run's")
    if len(rows) == baseline_rows(t):   # all there
        transaction.on_commit(partial(keep_baseline, key, baseline))
    return baseline


def keep_baseline(key: tuple, baseline: Baseline | None) -> None:
    if len(OWN_BASELINES) >= OWN_BASELINES_KEPT:
        OWN_BASELINES.clear()
    OWN_BASELINES[key] = baseline


def with_links(run: Run, evidence: dict) -> dict:
    """A finding's evidence, its inspector reference ("samples": {"step", "truncated"})
    given the inspector's URL for this run."""
    ref = evidence.get("samples")
    if not ref:
        return evidence
    query = f"?step={ref['step']}" + ("&truncated=true" if ref.get("truncated") else "")
    return {**evidence, "samples": {**ref, "url": reverse("run-samples", args=[run.pk])
                                    + query}}


def do_apply_findings(run: Run, findings: list[Finding]) -> list[Alert]:
    changed: list[Alert] = []
    notices: list[Notification] = []
    with transaction.atomic():
        live = {a.dedup_key: a for a in Alert.objects.filter(run=run, state__in=LIVE_STATES)}
        for f in {f.key: f for f in findings}.values():
            f.evidence = with_links(run, f.evidence)
            alert = live.pop(f.key, None)
            if alert is None:
                alert = Alert.objects.create(
                    run=run, kind=f.kind, dedup_key=f.key, cause=f.cause, runbook=f.runbook,
                    evidence=f.evidence, step=f.step, last_step=f.step)
                changed.append(alert)
                notices += queue_notifications(alert, AlertState.OPEN)
            elif (alert.cause, alert.runbook, alert.evidence, alert.last_step) != (
                    f.cause, f.runbook, f.evidence, f.step):   # most evaluations: as it was
                Alert.objects.filter(pk=alert.pk).update(
                    cause=f.cause, runbook=f.runbook, evidence=f.evidence, last_step=f.step)
        for alert in live.values():
            if alert.resolve(None, "the condition cleared"):
                changed.append(alert)
                notices += queue_notifications(alert, AlertState.RESOLVED)
        if run.status in ENDED:
            reason = f"the run ended ({run.status}); its condition can no longer clear"
            for alert in Alert.objects.filter(run=run, state__in=LIVE_STATES):
                if alert.resolve(None, reason):
                    changed.append(alert)
                    notices += queue_notifications(alert, AlertState.RESOLVED)
        if changed:
            transaction.on_commit(partial(announce, run.pk, [a.pk for a in changed],
                                          [n.pk for n in notices]), robust=True)
    return changed


def queue_notifications(alert: Alert, event: str) -> list[Notification]:
    return [Notification.objects.create(alert=alert, channel=channel, event=event)
            for channel in AlertChannel.objects.filter(enabled=True)]


def announce(run_id: int, alert_ids: list[int], notification_ids: list[int]) -> None:
    """Send the changed alerts to the run page and queue their notifications."""
    for pk in notification_ids:
        deliver_notification.delay(pk)
    broadcast_alerts(run_id, alert_ids)


def broadcast_alerts(run_id: int, alert_ids: list[int]) -> None:
    """The run page's consumer renders each alert for its own user's role (operator
    buttons), once per ``broadcast`` (an id) and role for a process's sockets."""
    group_send((run_group(run_id), {"type": "run.alerts", "alert_ids": alert_ids,
                                    "broadcast": uuid.uuid4().hex}))


def do_acknowledge(alert: Alert, user) -> bool:
    with transaction.atomic():
        done = alert.acknowledge(user)
        if done:
            transaction.on_commit(partial(broadcast_alerts, alert.run_id, [alert.pk]),
                                  robust=True)
    return done


def do_resolve(alert: Alert, user) -> bool:
    with transaction.atomic():
        done = alert.resolve(user, f"resolved by {user}")
        if done:
            notices = queue_notifications(alert, AlertState.RESOLVED)
            transaction.on_commit(partial(announce, alert.run_id, [alert.pk],
                                          [n.pk for n in notices]), robust=True)
    return done
