"""A launched command's output in the run's log panel: its Ray job's log, followed.

    sync_runs (beat, every 10 s) -> follow_job_logs()
        for each launched external run that is live, or ended in the last JOB_LOG_GRACE_S:
            get_job_logs(sid)[the lines not stored yet] -> "log" RunEvents, level "job"
            -> the run page's socket ("run.job_logs": appended to the log panel)

Where the lines go, and why their seqs are negative: the command's own process reports
seq 1, 2, ... through ingest (rlplane.track), and the run page streams and backfills
RunEvents in that order with no gap. The job's output is a second stream the process
knows nothing of, so it must not take seqs from that range. Line k of the job's log
(1-based, counted from the log's start) is stored as a RunEvent with seq -k:

- no collision: ingest refuses seq < 1, and (run, seq) stays the one unique key, so two
  followers racing on a run store each line once;
- the offset is in the rows: the lines read so far are -min(seq); nothing else to keep
  (blank lines are not stored: trailing ones are read again, and skipped again);
- the process's stream is untouched: RunEvent.highest_seq, the socket's backfill, the
  REST events' after_seq and ingest's bound on seqs ahead all count seqs above 0;
- the log panel merges both by time (jobs/queries/run_page.py recent_logs).

Bounds: at most JOB_LOG_LINES_PER_SYNC new lines per sync (a burst beyond them is one
"... N lines not shown" line at the first skipped line's seq; `ray job logs <sid>` has
them all), each cut to JOB_LOG_LINE_CHARS, and the newest JOB_LOG_KEEP lines of a run
kept. A line still being written (no newline yet) waits for its newline, or for
the job's end. Cost: Ray's API returns a job's whole log each time, so each sync reads
O(log size) per live command.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from functools import partial

from django.db import models, transaction
from django.utils import timezone

from engine.api import LogEvent
from jobs.cluster.ray import job_not_found, ray_jobs
from jobs.groups import group_send, run_group
from jobs.models import LIVE, Run, RunEvent

logger = logging.getLogger(__name__)

JOB_LOG_LEVEL = "job"          # the panel's label for the command's own output
JOB_LOG_LINES_PER_SYNC = 500   # new lines stored per run per sync; more: the newest
JOB_LOG_KEEP = 5000            # a run's newest job log lines kept
JOB_LOG_LINE_CHARS = 4000      # a longer line keeps its start, and says how much was cut
JOB_LOG_GRACE_S = 120          # a run that ended is followed this long for its last lines


def lines_read(run: Run) -> int:
    """How many lines of the run's job log are stored (or skipped): -min(seq) below 0."""
    low = RunEvent.objects.filter(run=run, seq__lt=0).aggregate(m=models.Min("seq"))["m"]
    return -low if low is not None else 0


def complete_lines(text: str, job_ended: bool) -> list[str]:
    """The log's lines; the last one only once it ends with a newline or the job ended.
    A progress bar's carriage returns keep what it showed last."""
    lines = text.split("\n")
    partial_line = lines.pop()
    if job_ended and partial_line:
        lines.append(partial_line)
    return [line.rstrip("\r").rsplit("\r", 1)[-1] for line in lines]


def new_log_rows(run: Run, lines: list[str], read: int, now: float) -> list[RunEvent]:
    """RunEvents of ``lines[read:]`` (line k at seq -k), bounded per sync."""
    fresh = list(enumerate(lines[read:], start=read + 1))
    rows = []
    if len(fresh) > JOB_LOG_LINES_PER_SYNC:
        skipped = len(fresh) - JOB_LOG_LINES_PER_SYNC
        first = fresh[0][0]
        fresh = fresh[skipped:]
        rows.append(log_row(run, first, now, f"... {skipped} lines not shown (all of them: "
                                             f"ray job logs {run.ray_submission_id})"))
    rows += [log_row(run, k, now, shortened(line)) for k, line in fresh if line.strip()]
    return rows


def shortened(line: str) -> str:
    if len(line) <= JOB_LOG_LINE_CHARS:
        return line
    return f"{line[:JOB_LOG_LINE_CHARS]} [{len(line) - JOB_LOG_LINE_CHARS} characters cut]"


def log_row(run: Run, k: int, now: float, message: str) -> RunEvent:
    payload = LogEvent(seq=-k, ts=now, level=JOB_LOG_LEVEL, message=message).to_dict()
    return RunEvent(run=run, seq=-k, type=LogEvent.type, ts=now, payload=payload)


def do_store_job_log(run: Run, text: str, job_ended: bool) -> list[dict]:
    """Store the lines of ``text`` (the job's whole log) not stored yet; announce them on
    commit. Returns the stored payloads."""
    lines = complete_lines(text, job_ended)
    with transaction.atomic():
        # Under the run's row lock, as ingest: of two followers the second sees the rows
        # of the first and stores nothing twice (nor announces it twice).
        if Run.objects.select_for_update().filter(pk=run.pk).first() is None:
            return []   # deleted meanwhile: its event table keeps no foreign key to check
        read = lines_read(run)
        if len(lines) <= read:
            return []
        rows = new_log_rows(run, lines, read, time.time())
        RunEvent.objects.bulk_create(rows, ignore_conflicts=True)
        RunEvent.objects.filter(run=run, seq__lt=0, seq__gte=-(len(lines) - JOB_LOG_KEEP)) \
            .delete()
        payloads = [row.payload for row in rows]
        if payloads:
            transaction.on_commit(partial(broadcast_job_log, run.pk, payloads), robust=True)
    return payloads


def job_log_lines(run: Run, after_line: int = 0) -> models.QuerySet:
    """The run's stored job log lines after line ``after_line``, oldest first (a query of
    RunEvents; a line's number is -seq)."""
    return RunEvent.objects.filter(run=run, seq__lt=-after_line, type=LogEvent.type) \
        .order_by("-seq")


def broadcast_job_log(run_id: int, payloads: list[dict]) -> None:
    group_send((run_group(run_id), {"type": "run.job_logs", "run_id": run_id,
                                    "events": payloads}))


def followed_runs() -> list[Run]:
    """Launched external runs whose job may have lines not stored yet."""
    recent = timezone.now() - timedelta(seconds=JOB_LOG_GRACE_S)
    runs = (Run.objects.exclude(ray_submission_id="")
            .filter(models.Q(status__in=LIVE) | models.Q(finished_at__gte=recent)))
    return [run for run in runs if run.is_external]


def follow_job_logs() -> None:
    """Store the new lines of each followed run's Ray job log. A job Ray no longer knows
    is left to follow_ray_jobs; a log Ray cannot give now (its node away, the dashboard
    busy) is logged and read at the next sync: the lines wait in Ray, and one run's log
    must not hold up the others'."""
    runs = followed_runs()
    client = ray_jobs() if runs else None
    for run in runs:
        sid = run.ray_submission_id
        try:
            # The status first: a job that had ended before its log was read has all of
            # its lines in it, the last one too.
            ended = run.is_terminal and client.get_job_status(sid).is_terminal()
            text = client.get_job_logs(sid)
        except (RuntimeError, OSError) as exc:  # requests' errors are OSErrors
            if not job_not_found(exc):
                logger.warning("run %s: Ray did not give job %s's log: %s", run.pk, sid, exc)
            continue
        do_store_job_log(run, text, ended)
