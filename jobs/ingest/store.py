"""What ingest does with a batch of the engine's events, in one transaction: store what is
new by (run, seq), derive the rows the pages read (metric points, phase spans, checkpoints,
applied controls, inspected samples), follow the engine's status, and announce the stored
events on commit (nothing is announced that did not commit). The alert rules run after
the commit, debounced per run (jobs.alerts.debounce)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial

from django.db import transaction
from django.db.models import F

from engine.api import (
    CheckpointEvent,
    ControlAppliedEvent,
    Event,
    MetricsEvent,
    RolloutSample,
    RunStatusEvent,
    SamplesEvent,
    SpanEvent,
    WorkersResizedEvent,
    canonical_metrics,
)
from engine.api import metrics as M
from jobs.alerts.debounce import evaluate_alerts_soon
from jobs.alerts.history import HISTORY_EVENTS
from jobs.groups import RUNS_GROUP, group_send, run_group
from jobs.ingest.batch import json_safe
from jobs.ingest.bulk import (
    insert_events,
    insert_spans,
    stored_seqs,
    upsert_metric_points,
)
from jobs.ingest.name_cap import capped_with_steps
from jobs.models import (
    Checkpoint,
    InspectedSample,
    InvalidTransition,
    Run,
    RunControl,
    RunEvent,
    RunStatus,
)
from jobs.models.samples import max_gap
from jobs.rollups import derive_rollups
from jobs.runs.queue import schedule_on_commit

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
    refused: tuple[dict, ...] = ()   # over the name cap (capped=True): batch error entries


def do_ingest_events(run: Run, events: Sequence[Event], capped: bool = False) -> IngestResult:
    """Store the events that are new by (run, seq), derive metric points, spans,
    checkpoints and status from them, and group_send them to ``run.<id>`` on commit.
    An external run's metric names are its framework's: they are stored as rlplane's
    (engine.frameworks), the ones no table maps as they came. ``capped``: metrics events
    that would add names past the run's cap are refused (jobs.ingest.name_cap), checked
    under the run's lock with the same read of its names' highest steps that the points
    need."""
    with transaction.atomic():
        # Serialize concurrent ingests of one run (a retry racing its original request),
        # so "which seqs are new" stays true until we insert them. On SQLite the
        # IMMEDIATE transaction already holds the write lock.
        if Run.objects.select_for_update().filter(pk=run.pk).values_list("pk").first() is None:
            # Deleted since the caller read it: nothing may be stored under it (the event
            # tables keep no foreign key to check it: jobs/models/series.py).
            raise Run.DoesNotExist(f"run {run.pk} does not exist")
        events, refused, highest = capped_with_steps(run, events, capped)
        if run.is_external:
            events = [dataclasses.replace(e, values=canonical_metrics(run.framework, e.values))
                      if isinstance(e, MetricsEvent) else e for e in events]
        by_seq: dict[int, Event] = {}
        for event in events:
            by_seq.setdefault(event.seq, event)
        # Under the lock no seq of the run is stored meanwhile: those past its highest
        # are new without a look-up (a run moving forward: every one of them).
        top = RunEvent.highest_seq(run)
        known = [seq for seq in by_seq if seq <= top]
        stored = stored_seqs(run.pk, known)
        new = [by_seq[seq] for seq in sorted(by_seq) if seq not in stored]
        payloads = [stored_payload(event) for event in new]
        insert_events(run.pk, payloads, new=not known)
        if any(e.seq <= top and e.type in HISTORY_EVENTS for e in new):
            # out of order: the rules' cached history reads past its highest seq
            Run.objects.filter(pk=run.pk).update(history_rewrites=F("history_rewrites") + 1)
        derive_rows(run, new, highest)
        for event in new:
            if isinstance(event, RunStatusEvent):
                apply_engine_status(run, event)
        if run.is_terminal and any(isinstance(e, RunStatusEvent) for e in new):
            schedule_on_commit()  # what the run held is free now
        last_seq = max([top, *(e.seq for e in new)])  # RunEvent.highest_seq(run) now
        if payloads:
            # robust: the events are stored either way; a page that missed the broadcast
            # backfills from the database.
            transaction.on_commit(
                partial(broadcast_events, run.pk, payloads, run_summary(run, new)), robust=True)
    if new:
        # After the batch committed, not under its row lock: the rules read a few thousand
        # events (tens of ms), which held every other batch of the run waiting.
        evaluate_alerts_soon(run.pk)
    return IngestResult(stored=len(new), duplicates=len(events) - len(new), last_seq=last_seq,
                        refused=tuple(refused))


def stored_payload(event: Event) -> dict:
    """What RunEvent keeps of an event (and the run's socket is sent): all of it, but of a
    samples event its step and count (its rollouts are InspectedSample rows, bounded)."""
    if isinstance(event, SamplesEvent):
        return {"type": event.type, "seq": event.seq, "ts": event.ts, "step": event.step,
                "count": len(event.samples)}
    # event.to_dict() without dataclasses.asdict's deep copy of every value (a third of a
    # batch's CPU at 100 runs): json_safe copies the containers (metric values, names)
    # anyway, and no event but a samples event nests a dataclass.
    return {"type": event.type, **{k: json_safe(v) for k, v in vars(event).items()}}


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
                            tokens=sample_tokens(s),
                            max_gap=max_gap(s.behaviour_logprobs, s.learner_logprobs))
            for i, s in enumerate(e.samples))
    if events:
        InspectedSample.keep_recent(run)


def sample_tokens(s: RolloutSample) -> dict:
    """InspectedSample.tokens: the per-token lists, and a trajectory's turns (a single-turn
    rollout's row has none)."""
    tokens = {"text": s.tokens, "behaviour": s.behaviour_logprobs,
              "learner": s.learner_logprobs}
    if s.turns:
        tokens["turns"] = [dataclasses.asdict(t) for t in s.turns]
    return tokens


def derive_rows(run: Run, events: Sequence[Event], highest: dict[str, int]) -> None:
    """Metric points, phase spans, checkpoints and applied controls from newly stored
    events (in seq order), ``highest`` the highest stored step of (at least) each name
    they report (last_steps).

    A (name, step) or checkpoint step reported again -- a resumed run redoing a step --
    takes the later value, hence an upsert rather than ignore (points: jobs.ingest.bulk).
    """
    points: dict[tuple[str, int], float | None] = {}
    spans: list[tuple] = []  # jobs.ingest.bulk.SPAN_FIELDS
    checkpoints: dict[int, Checkpoint] = {}
    for e in events:
        if isinstance(e, MetricsEvent):
            for name, value in json_safe(e.values).items():
                points[name, e.step] = value
        elif isinstance(e, SpanEvent):
            spans.append((e.device, e.phase, e.start, e.end, e.step, e.version))
        elif isinstance(e, ControlAppliedEvent):
            RunControl.objects.filter(run=run, pk=e.control_id, applied_at=None).update(
                applied_step=e.step, applied_at=datetime.fromtimestamp(e.ts, UTC),
                message=e.message)
        elif isinstance(e, CheckpointEvent):
            checkpoints[e.step] = Checkpoint(
                run=run, step=e.step, version=e.version, path=e.path,
                fingerprint=e.fingerprint, created_at=datetime.fromtimestamp(e.ts, UTC),
            )
    if points:
        # One read for all: the buckets the points close, whether any is stored (and the
        # name cap's check).
        derive_rollups(run, points, highest,
                       min(e.ts for e in events if isinstance(e, MetricsEvent)))
        upsert_metric_points(run.pk, points, new=all(
            name not in highest or step > highest[name] for name, step in points))
    insert_spans(run.pk, spans)
    Checkpoint.objects.bulk_create(
        checkpoints.values(), update_conflicts=True, unique_fields=["run", "step"],
        update_fields=["version", "path", "fingerprint", "created_at"],
    )
    derive_samples(run, [e for e in events if isinstance(e, SamplesEvent)])
    derive_rollout_workers(run, events)


def derive_rollout_workers(run: Run, events: Sequence[Event]) -> None:
    """The run's rollout workers after its newest live resize (Run.rollout_workers), or
    None again once a driver starts (it places the launch config)."""
    held = run.rollout_workers
    for e in events:
        if isinstance(e, WorkersResizedEvent):
            held = e.workers
        elif isinstance(e, RunStatusEvent) and e.status == "starting":
            held = None
    if held != run.rollout_workers:
        run.rollout_workers = held
        Run.objects.filter(pk=run.pk).update(rollout_workers=held)


def apply_engine_status(run: Run, event: RunStatusEvent) -> None:
    """Follow the engine's status where the state machine allows it (``Run.advance_to``:
    an engine that stopped without a stop request goes through stopping, so the history
    stays a legal path).

    A status the machine refuses (a late "running" after the run was marked lost, a replay
    after a stop) leaves the run as it is: its status_reason explains the state it is in,
    and the event itself is kept in RunEvent.
    """
    target, reason = ENGINE_STATUS[event.status], event.message
    run.refresh_from_db(fields=["status", "status_reason"])
    if target == RunStatus.STOPPED and run.status == RunStatus.STOPPING and run.status_reason:
        # Who asked (the control plane's reason) and where the engine stopped (its own).
        reason = f"{run.status_reason}; {reason}" if reason else run.status_reason
    try:
        run.advance_to(target, reason)
    except InvalidTransition as exc:
        logger.warning("run %s: ignored engine status %r (seq %s): %s",
                       run.pk, event.status, event.seq, exc)


def run_summary(run: Run, events: Sequence[Event]) -> dict:
    """What the runs list shows of a run after these events: status and latest metrics
    (None where this batch reported none, so the list keeps what it shows). The step is
    the steps trained (Run.steps_done), from a training step's metrics: an eval's are
    named by the count of steps before it, and an external framework's by its own."""
    latest: dict[str, float | None] = {}
    step = None
    for event in events:
        if isinstance(event, MetricsEvent):
            if run.is_external or M.TIME_STEP_S in event.values:
                step = event.step
            latest.update(event.values)
    return {"type": "runs.summary", "run_id": run.pk, "status": run.status,
            "step": run.steps_done(step), "reward_mean": json_safe(latest.get(M.REWARD_MEAN)),
            "step_s": json_safe(latest.get(M.TIME_STEP_S)),
            "held_out": json_safe(latest.get(M.EVAL_REWARD_MEAN))}


def broadcast_events(run_id: int, events: list[dict], summary: dict | None = None) -> None:
    """Send newly stored events, in seq order, to the run's channel group, and the run's
    summary to the runs list's group."""
    messages = [(run_group(run_id), {"type": "run.events", "run_id": run_id, "events": events})]
    if summary is not None:
        messages.append((RUNS_GROUP, summary))
    group_send(*messages)
