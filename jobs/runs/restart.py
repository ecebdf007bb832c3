"""A driver that died without saying why, submitted again (issue 30: run.max_restarts).

    restarts_left(run)                    what its config still allows (0 for an external
                                          run, a stop requested, or a budget spent)
    restart_driver(run, client, cause)    its next Ray job, "<job>-restart-<n>", running
                                          the same `python -m engine.ray_job --resume`:
                                          the driver resumes from its latest checkpoint
                                          (weights, weight version, data position)
    carry_controls(run)                   what applied live controls set (lr, eval
                                          cadence, rollout workers, a pause), asked of
                                          the restarted driver again

sync_runs (jobs/runs/tasks.py) restarts a live run whose job ended with no final status
from the engine (a killed driver, a crash outside the loop) after reconciling what it
wrote; only when no restart is left is the run marked lost or failed. The engine's own
"failed" (an exception it caught, a bound it enforced) is never restarted: it would fail
again. A lost Ray head ends its runs instead (controlplane/stack.py): their jobs are gone.

Twins (two sync_runs at once) agree: the job id is derived from the restart's number, so
the second finds the first's job (ensure_job), and the record is written only by the one
whose conditional update still sees the job that ended.
"""

from __future__ import annotations

import logging

from django.db.models import Max
from django.utils import timezone

from engine.api import CONTROL_VALUE_TYPES
from jobs.cluster.ray import submission_id
from jobs.models import LIVE, MetricPoint, Run, RunControl
from jobs.runs.submit import ensure_job

logger = logging.getLogger(__name__)


def restarts_left(run: Run) -> int:
    if run.stop_requested_at is not None:
        return 0
    return max(0, run.max_restarts - len(run.restarts))


def restart_driver(run: Run, client, cause: str) -> None:
    """Submit the run's driver again after ``cause`` ended it. Raises what submitting
    raises (the caller marks the run lost with it)."""
    ended = run.ray_submission_id
    attempt = len(run.restarts) + 1
    allowed = run.max_restarts
    sid = submission_id(run.pk, attempt)
    last = MetricPoint.objects.filter(run=run).aggregate(m=Max("step"))["m"]
    ensure_job(run, client, sid)
    record = {"at": timezone.now().isoformat(), "cause": cause, "job": ended, "step": last}
    reason = (f"driver restarted ({attempt} of {allowed}, run.max_restarts): {cause}; it "
              "resumes from its latest checkpoint")
    updated = Run.objects.filter(pk=run.pk, ray_submission_id=ended, status__in=LIVE) \
        .update(ray_submission_id=sid, restarts=[*run.restarts, record],
                status_reason=reason)
    if updated:
        logger.warning("run %s: %s (job %s)", run.pk, reason, sid)
        carried = carry_controls(run)
        if carried:
            logger.info("run %s: asked its restarted driver again for %s", run.pk,
                        ", ".join(c.label for c in carried))
        return
    logger.info("run %s: a twin restarted it first, or it ended meanwhile", run.pk)
    run.refresh_from_db()
    if run.is_terminal and run.ray_submission_id != sid:
        client.stop_job(sid)           # the run ended meanwhile: its restart has no place


# What a live control sets holds until changed (the learning rate, the eval cadence, the
# rollout workers, a pause), but lives in the driver: a restarted one starts from the
# config and its checkpoint. Pause and resume set one thing between them.
SETTING_OF = {**{kind: kind for kind in CONTROL_VALUE_TYPES}, "pause": "pause",
              "resume": "pause"}


def carry_controls(run: Run) -> list[RunControl]:
    """Ask the restarted driver again for what the run's applied live controls set (the
    last of each setting; a pause only if the run was paused), as new controls of the
    same requester: it applies them at its first step boundary. A setting with a control
    still pending is left to that one, which comes later and wins."""
    controls = RunControl.objects.filter(run=run, kind__in=SETTING_OF).order_by("id")
    last: dict[str, RunControl] = {}
    pending: set[str] = set()
    for c in controls:
        if c.applied_at is None:
            pending.add(SETTING_OF[c.kind])
        else:
            last[SETTING_OF[c.kind]] = c
    carried = [c for setting, c in last.items()
               if setting not in pending and c.kind != "resume"]
    return RunControl.objects.bulk_create([
        RunControl(run=run, kind=c.kind, value=c.value, requested_by_id=c.requested_by_id)
        for c in sorted(carried, key=lambda c: c.pk)])
