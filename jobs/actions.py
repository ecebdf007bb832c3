"""Side effects, in one place. Each do_* saves first and announces on commit, so nothing
is announced that did not commit."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction
from django.utils import timezone

from engine.api import (
    CheckpointEvent,
    Control,
    ControlAppliedEvent,
    Event,
    MetricsEvent,
    RunStatusEvent,
    SamplesEvent,
    SpanEvent,
)
from jobs.alerts.lifecycle import do_evaluate_alerts
from jobs.event_batch import json_safe
from jobs.groups import RUNS_GROUP, run_group
from jobs.models import (
    Checkpoint,
    InspectedSample,
    InvalidTransition,
    MetricPoint,
    PhaseSpan,
    Run,
    RunControl,
    RunEvent,
    RunStatus,
)
from jobs.models.run import run_directory
from jobs.models.samples import max_gap
from jobs.queue import schedule_on_commit
from jobs.tasks import stop_run

logger = logging.getLogger(__name__)

# The engine's run.status values -> the control plane's state machine.
ENGINE_STATUS = {
    "starting": RunStatus.RUNNING,
    "warm_start": RunStatus.RUNNING,
    "running": RunStatus.RUNNING,
    "succeeded": RunStatus.SUCCEEDED,
    "failed": RunStatus.FAILED,
    "stopped": RunStatus.STOPPED,
}


@dataclass(frozen=True)
class IngestResult:
    stored: int      # events new to this run
    duplicates: int  # events whose seq was already stored (a replay), or repeated in the batch
    last_seq: int    # the highest seq stored for the run, 0 when none


def do_ingest_events(run: Run, events: Sequence[Event]) -> IngestResult:
    """Store the events that are new by (run, seq), derive metric points, spans,
    checkpoints and status from them, and group_send them to ``run.<id>`` on commit."""
    with transaction.atomic():
        # Serialize concurrent ingests of one run (a retry racing its original request),
        # so "which seqs are new" stays true until we insert them. On SQLite the
        # IMMEDIATE transaction already holds the write lock.
        Run.objects.select_for_update().filter(pk=run.pk).first()
        by_seq: dict[int, Event] = {}
        for event in events:
            by_seq.setdefault(event.seq, event)
        stored_seqs = set(
            RunEvent.objects.filter(run=run, seq__in=list(by_seq)).values_list("seq", flat=True)
        )
        new = [by_seq[seq] for seq in sorted(by_seq) if seq not in stored_seqs]
        payloads = [stored_payload(event) for event in new]
        RunEvent.objects.bulk_create(
            [RunEvent(run=run, seq=p["seq"], type=p["type"], ts=p["ts"], payload=p)
             for p in payloads],
            ignore_conflicts=True,
        )
        derive_rows(run, new)
        for event in new:
            if isinstance(event, RunStatusEvent):
                apply_engine_status(run, event)
        if run.is_terminal and any(isinstance(e, RunStatusEvent) for e in new):
            schedule_on_commit()  # what the run held is free now
        if new:
            # Under the run's row lock, like the periodic task. A failing rule must not
            # cost the events: it is logged, its savepoint rolled back, the batch stored.
            try:
                with transaction.atomic():
                    do_evaluate_alerts(run)
            except Exception:
                logger.exception("run %s: alert evaluation failed; events stored", run.pk)
        last_seq = RunEvent.highest_seq(run)
        if payloads:
            # robust: the events are stored either way; a page that missed the broadcast
            # backfills from the database.
            transaction.on_commit(
                partial(broadcast_events, run.pk, payloads, run_summary(run, new)), robust=True)
    return IngestResult(stored=len(new), duplicates=len(events) - len(new), last_seq=last_seq)


def stored_payload(event: Event) -> dict:
    """What RunEvent keeps of an event (and the run's socket is sent): all of it, but of a
    samples event its step and count (its rollouts are InspectedSample rows, bounded)."""
    if isinstance(event, SamplesEvent):
        return {"type": event.type, "seq": event.seq, "ts": event.ts, "step": event.step,
                "count": len(event.samples)}
    return json_safe(event.to_dict())


def derive_samples(run: Run, events: Sequence[SamplesEvent]) -> None:
    """InspectedSample rows of the new samples events; a step sampled again (a resumed
    run redoing it) takes the later rollouts. Then the retention setting applies."""
    for e in events:
        InspectedSample.objects.filter(run=run, step=e.step).delete()
        InspectedSample.objects.bulk_create(
            InspectedSample(run=run, step=e.step, index=i, group=s.group, prompt=s.prompt,
                            completion=s.completion, reward=s.reward, reason=s.reason,
                            advantage=s.advantage, version=s.version,
                            last_version=s.last_version, staleness=s.staleness,
                            length=s.length, truncated=s.truncated,
                            tokens={"text": s.tokens, "behaviour": s.behaviour_logprobs,
                                    "learner": s.learner_logprobs},
                            max_gap=max_gap(s.behaviour_logprobs, s.learner_logprobs))
            for i, s in enumerate(e.samples))
    if events:
        InspectedSample.keep_recent(run)


def derive_rows(run: Run, events: Sequence[Event]) -> None:
    """Metric points, phase spans, checkpoints and applied controls from newly stored
    events (in seq order).

    A (name, step) or checkpoint step reported again -- a resumed run redoing a step --
    takes the later value, hence update_conflicts rather than ignore.
    """
    points: dict[tuple[str, int], MetricPoint] = {}
    spans: list[PhaseSpan] = []
    checkpoints: dict[int, Checkpoint] = {}
    for e in events:
        if isinstance(e, MetricsEvent):
            for name, value in json_safe(e.values).items():
                points[name, e.step] = MetricPoint(run=run, step=e.step, name=name, value=value)
        elif isinstance(e, SpanEvent):
            spans.append(PhaseSpan(run=run, device=e.device, phase=e.phase, start=e.start,
                                   end=e.end, step=e.step, version=e.version))
        elif isinstance(e, ControlAppliedEvent):
            RunControl.objects.filter(run=run, pk=e.control_id, applied_at=None).update(
                applied_step=e.step, applied_at=datetime.fromtimestamp(e.ts, UTC),
                message=e.message)
        elif isinstance(e, CheckpointEvent):
            checkpoints[e.step] = Checkpoint(
                run=run, step=e.step, version=e.version, path=e.path,
                fingerprint=e.fingerprint, created_at=datetime.fromtimestamp(e.ts, UTC),
            )
    MetricPoint.objects.bulk_create(
        points.values(), update_conflicts=True, unique_fields=["run", "name", "step"],
        update_fields=["value"],
    )
    PhaseSpan.objects.bulk_create(spans)
    Checkpoint.objects.bulk_create(
        checkpoints.values(), update_conflicts=True, unique_fields=["run", "step"],
        update_fields=["version", "path", "fingerprint", "created_at"],
    )
    derive_samples(run, [e for e in events if isinstance(e, SamplesEvent)])


def apply_engine_status(run: Run, event: RunStatusEvent) -> None:
    """Follow the engine's status where the state machine allows it (``Run.advance_to``:
    an engine that stopped without a stop request goes through stopping, so the history
    stays a legal path).

    A status the machine refuses (a late "running" after the run was marked lost, a replay
    after a stop) leaves the run as it is: its status_reason explains the state it is in,
    and the event itself is kept in RunEvent.
    """
    try:
        run.advance_to(ENGINE_STATUS[event.status], event.message)
    except InvalidTransition as exc:
        logger.warning("run %s: ignored engine status %r (seq %s): %s",
                       run.pk, event.status, event.seq, exc)


def run_summary(run: Run, events: Sequence[Event]) -> dict:
    """What the runs list shows of a run after these events: status and latest metrics
    (None where this batch reported none, so the list keeps what it shows)."""
    latest: dict[str, float | None] = {}
    step = None
    for event in events:
        if isinstance(event, MetricsEvent):
            step = event.step
            latest.update(json_safe(event.values))
    return {"type": "runs.summary", "run_id": run.pk, "status": run.status, "step": step,
            "reward_mean": latest.get("reward/mean"), "step_s": latest.get("time/step_s"),
            "held_out": latest.get("eval/reward_mean")}


def broadcast_events(run_id: int, events: list[dict], summary: dict | None = None) -> None:
    """Send newly stored events, in seq order, to the run's channel group, and the run's
    summary to the runs list's group."""
    message = {"type": "run.events", "run_id": run_id, "events": events}
    layer = get_channel_layer()
    async_to_sync(layer.group_send)(run_group(run_id), message)
    if summary is not None:
        async_to_sync(layer.group_send)(RUNS_GROUP, summary)


# --- launch, stop, fork, queue, archive ------------------------------------------------------

class Refused(Exception):
    """An action the run's state does not allow; the message says why."""


def do_launch_run(user, name: str, config: dict, priority: int = 0) -> Run:
    """Save a queued run; once the row is committed the queue starts it when its
    placement fits (jobs/queue.py)."""
    with transaction.atomic():
        run = Run.objects.create(name=name, config=config, created_by=user, priority=priority)
        schedule_on_commit()
    return run


def do_fork_run(user, parent: Run, checkpoint: Checkpoint, config: dict,
                priority: int = 0) -> Run:
    """A new run that starts from one of ``parent``'s checkpoints with ``config``."""
    if checkpoint.run_id != parent.pk:
        raise ValueError(f"checkpoint {checkpoint.pk} belongs to run {checkpoint.run_id}, "
                         f"not to run {parent.pk}")
    if not checkpoint.on_disk():
        raise Refused(f"run {parent.pk}'s checkpoint at step {checkpoint.step} is no longer "
                      f"on disk (a run keeps its last checkpoint.keep_last); fork from one "
                      "that is")
    if problem := parent.fork_problem(config):
        raise Refused(f"{problem[0]}: {problem[1]}")
    with transaction.atomic():
        run = Run.objects.create(name=config.get("name") or parent.name, config=config,
                                 created_by=user, parent=parent,
                                 source_checkpoint=str(checkpoint.directory()),
                                 priority=priority)
        schedule_on_commit()
    return run


def do_stop_run(user, run: Run) -> None:
    """Ask the run's driver to checkpoint and exit. The flag is in the database, where the
    driver polls it, before any task runs; the task only stops the Ray job if the driver
    has not exited in time. A run still waiting in the queue is cancelled: it never
    starts. Raises InvalidTransition when the run cannot be stopped."""
    with transaction.atomic():
        if run.status == RunStatus.QUEUED:
            run.transition_to(RunStatus.STOPPED, f"cancelled in the queue by {user}")
            return
        run.request_stop(f"stop requested by {user}")
        transaction.on_commit(lambda: stop_run.delay(run.pk))


def do_request_control(user, run: Run, control: Control) -> RunControl:
    """Ask a running run's driver for a live control (validated: engine.controls); it
    polls it and applies it at the next step boundary. Raises Refused unless the run is
    being submitted or running."""
    with transaction.atomic():
        run.refresh_from_db(fields=["status"])
        if run.status not in (RunStatus.SUBMITTING, RunStatus.RUNNING):
            raise Refused(f"run {run.pk} is {run.status}; live controls need a running run")
        value = getattr(control, "value", None)
        row = RunControl.objects.create(run=run, kind=control.kind, requested_by=user,
                                        value=None if value is None else float(value))
        logger.info("run %s: control %s (%s) requested by %s", run.pk, row.pk, row.label, user)
    return row


def do_set_priority(user, run: Run, priority: int) -> None:
    """Change a queued run's place in the queue (higher starts first). Raises Refused
    when the run is no longer queued."""
    with transaction.atomic():
        if not Run.objects.filter(pk=run.pk, status=RunStatus.QUEUED).update(priority=priority):
            run.refresh_from_db(fields=["status"])
            raise Refused(f"run {run.pk} is {run.status}; only a queued run's priority "
                          "can change")
        run.priority = priority
        logger.info("run %s: priority %s set by %s", run.pk, priority, user)
        schedule_on_commit()


def do_archive_run(user, run: Run) -> None:
    """Take a finished run off the runs list. Raises Refused for a run that is not
    finished (stop it first)."""
    if not run.is_terminal:
        raise Refused(f"run {run.pk} is {run.status}; only a finished run can be archived "
                      "(stop it first)")
    if run.archived_at is None:
        run.archived_at = timezone.now()
        Run.objects.filter(pk=run.pk, archived_at=None).update(archived_at=run.archived_at)



def do_restore_run(user, run: Run) -> None:
    """Put an archived run back on the runs list."""
    run.archived_at = None
    Run.objects.filter(pk=run.pk).update(archived_at=None)
    logger.info("run %s: restored to the runs list by %s", run.pk, user)


def do_delete_run(user, run: Run) -> None:
    """Delete a finished run: its rows (events, metrics, spans, checkpoints, alerts,
    controls go with it) and, once that commits, its directory under the runs dir.
    Raises Refused for a run that is not finished (stop or cancel it first) and for one
    whose checkpoint a fork still waits to start from."""
    with transaction.atomic():
        locked = Run.objects.select_for_update().filter(pk=run.pk).first()
        if locked is None:
            raise Refused(f"run {run.pk} no longer exists")
        if not locked.is_terminal:
            raise Refused(f"run {run.pk} is {locked.status}; only a finished run can be "
                          "deleted (stop or cancel it first)")
        waiting = list(locked.forks.filter(status__in=[RunStatus.QUEUED, RunStatus.SUBMITTING])
                       .values_list("pk", flat=True))
        if waiting:
            raise Refused(f"run {run.pk}'s checkpoint is where fork(s) "
                          f"{', '.join(f'#{pk}' for pk in waiting)} will start from; cancel "
                          "them or let them start first")
        directory = run_directory(run.pk)
        locked.delete()
        transaction.on_commit(partial(remove_run_directory, directory))
    logger.info("run %s deleted by %s", run.pk, user)


def remove_run_directory(directory: Path) -> None:
    if directory.exists():
        shutil.rmtree(directory)
