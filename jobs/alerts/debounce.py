"""The alert rules after ingest: debounced per run, out of the ingest transaction.

    ingest commits a batch with new events -> evaluate_alerts_soon(run id)
        RLPLANE_ALERT_DEBOUNCE_S > 0 (default 1): on commit,
            SET rlplane:alerts-due:<run> NX   (Redis, REDIS_URL)
                set      -> evaluate_run_alerts(run id) queued (Celery), to run at once
                existing -> nothing: an evaluation is queued and has not started yet; it
                            reads the history when it starts, so it sees this batch too
        RLPLANE_ALERT_DEBOUNCE_S = 0: at once, in the caller, after its transaction
            (tests, and an install without a Celery worker)

Not with a countdown: a task held for its ETA stays unacknowledged in the worker, and a
Redis that dies meanwhile made kombu's restore of it crash the worker (AttributeError in
_connparams; the stack drill of tests/e2e/test_stack_drills.py saw the extra restart).
Batches coalesce while their run's evaluation waits in the queue instead.

    evaluate_run_alerts(run id)  (Celery worker)
        DEL the key first, then lock the run's row and evaluate: a batch that commits
        after the DEL queues the next evaluation, one that committed before it is read

So at most one evaluation per run waits in the queue however fast it reports (a busy
worker coalesces more batches into each, it does not grow a backlog), and the rules see
each batch within the queue's wait plus one evaluation. Why Celery and Redis rather than
a timer in the web process: uvicorn runs several worker processes (each would evaluate
the same run), a web process may exit with a timer pending, and the rules' CPU belongs off
the processes that answer ingest. The
key's TTL (DUE_TTL_S) frees a run whose queued evaluation was lost with a worker; the
periodic task (jobs.alerts.tasks.evaluate_alerts, every 10 s) covers live runs meanwhile.
"""

from __future__ import annotations

import functools
import logging
from functools import partial

import redis
from celery import shared_task
from django.conf import settings
from django.db import transaction

from jobs.alerts.lifecycle import do_evaluate_alerts
from jobs.models import Run

DUE_KEY = "rlplane:alerts-due:{}"
DUE_TTL_S = 30

logger = logging.getLogger(__name__)


@functools.cache
def due_keys() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL)


def evaluate_alerts_soon(run_id: int) -> None:
    """The run has new events (committed, or committing with the caller's transaction)."""
    delay = settings.RLPLANE_ALERT_DEBOUNCE_S
    if delay <= 0:
        do_evaluate_run_alerts(run_id)
        return
    transaction.on_commit(partial(queue_evaluation, run_id), robust=True)


def queue_evaluation(run_id: int) -> None:
    key = DUE_KEY.format(run_id)
    if not due_keys().set(key, 1, nx=True, ex=DUE_TTL_S):
        return
    try:
        evaluate_run_alerts.apply_async((run_id,))
    except Exception:
        due_keys().delete(key)  # the next batch tries again
        raise


@shared_task
def evaluate_run_alerts(run_id: int) -> None:
    """The queued evaluation (controlplane.celery names this module for the worker)."""
    release(run_id)
    do_evaluate_run_alerts(run_id)


def release(run_id: int) -> None:
    """Before an evaluation reads the history (module docstring)."""
    due_keys().delete(DUE_KEY.format(run_id))


def do_evaluate_run_alerts(run_id: int) -> None:
    """The rules over the run's history under its row lock (two evaluations of one run
    never race to open the same key). A failing rule is logged: the events are stored
    whatever the rules make of them."""
    try:
        with transaction.atomic():
            run = Run.objects.select_for_update().filter(pk=run_id).first()
            if run is not None:
                do_evaluate_alerts(run)
    except Exception:
        logger.exception("run %s: alert evaluation failed", run_id)
