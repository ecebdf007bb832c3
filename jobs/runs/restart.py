"""A driver that died without saying why, submitted again (issue 30: run.max_restarts).

    restarts_left(run)                    what its config still allows (0 for an external
                                          run, a stop requested, or a budget spent)
    restart_driver(run, client, cause)    its next Ray job, "<job>-restart-<n>", running
                                          the same `python -m engine.ray_job --resume`:
                                          the driver resumes from its latest checkpoint
                                          (weights, weight version, data position)

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

from jobs.cluster.ray import submission_id
from jobs.models import LIVE, MetricPoint, Run
from jobs.runs.submit import ensure_job

logger = logging.getLogger(__name__)


def restarts_left(run: Run) -> int:
    if run.stop_requested_at is not None:
        return 0
    return max(0, run.max_restarts - len(run.restarts))


def restart_driver(run: Run, client, cause: str) -> str:
    """Submit the run's driver again after ``cause`` ended it; the reason the run page
    shows. Raises what submitting raises (the caller marks the run lost with it)."""
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
    else:
        logger.info("run %s: a twin restarted it first, or it ended meanwhile", run.pk)
    run.refresh_from_db()
    if run.is_terminal and run.ray_submission_id != sid:
        client.stop_job(sid)           # the run ended meanwhile: its restart has no place
    return reason
