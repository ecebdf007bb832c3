"""What a run's driver wrote to its own directory, into the database: once.

    do_reconcile_run(run)
        <run dir>/events.jsonl, ingest-spool.jsonl    every event the driver emitted, and
              -> seqs the run has not stored            those it could not deliver
              -> parse_event (ingest's own checks)
              -> do_ingest_events, in seq order      metric points, checkpoints, alerts,
                                                     the engine's final status
        <run dir>/checkpoints/step_NNNNNN/state.json  a finished checkpoint the database
              -> a Checkpoint row                      does not list (its event lost, or
                                                       telemetry.jsonl off)

When: sync_runs, before it marks a live run lost or ended from its Ray job (the engine's
own final status, if it wrote one, wins); the stack's start (manage.py reconcile_runs:
the control plane was down, the drivers were not); a restarted Ray head (manage.py
reconcile_runs --ray-head-died-at: its runs are then marked lost with that cause).
Idempotent: ingest keys on (run, seq) and checkpoints on (run, step), so a second
reconcile stores nothing; and cheap when there is nothing to do (no spool, and the last
line of events.jsonl already stored: the file is not read through).

The files are the driver's, as untrusted as its ingest token: every event passes ingest's
validation; a line over MAX_LINE_BYTES, not JSON or invalid is skipped and counted; no
symlink is followed.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from jobs.ingest.batch import MAX_EVENTS_PER_BATCH, MAX_TEXT_CHARS, parse_event
from jobs.ingest.store import do_ingest_events
from jobs.models import LIVE, Checkpoint, InvalidTransition, Run, RunEvent, RunStatus
from jobs.models.run import run_directory

logger = logging.getLogger(__name__)

EVENT_FILES = ("events.jsonl", "ingest-spool.jsonl")   # engine.ray_job's names
MAX_LINE_BYTES = 8 * 2**20       # a samples event at its bounds is well under this
MAX_STATE_BYTES = 64 * 2**10
TAIL_BYTES = 2**20               # where events.jsonl's last event is looked for
STEP_DIR = re.compile(r"step_(\d{6,12})")


@dataclass(frozen=True)
class Reconciled:
    events: int = 0        # events stored now
    checkpoints: int = 0   # checkpoint rows made from state.json alone
    skipped: int = 0       # lines or checkpoints that did not validate

    def __str__(self) -> str:
        text = f"{self.events} events and {self.checkpoints} checkpoints from its directory"
        return text + (f" ({self.skipped} unreadable entries skipped)" if self.skipped else "")


def do_reconcile_run(run: Run) -> Reconciled:
    """Ingest what ``run``'s directory holds and the database does not (module docstring)."""
    directory = run_directory(run.pk)
    if run.is_external or not directory.is_dir() or directory.is_symlink():
        return Reconciled()
    events = skipped = 0
    if not nothing_new(directory, RunEvent.highest_seq(run)):
        events, skipped = ingest_event_files(run, directory)
    checkpoints, bad = checkpoints_on_disk(run, directory / "checkpoints")
    return Reconciled(events=events, checkpoints=checkpoints, skipped=skipped + bad)


def ingest_event_files(run: Run, directory: Path) -> tuple[int, int]:
    """The events of EVENT_FILES the run has not stored, ingested: (stored, skipped)."""
    stored = set(RunEvent.objects.filter(run=run, seq__gt=0).values_list("seq", flat=True))
    found: dict[int, dict] = {}
    skipped = 0
    for name in EVENT_FILES:
        for item in json_lines(directory / name):
            seq = item.get("seq") if isinstance(item, dict) else None
            if type(seq) is not int:
                skipped += 1
            elif seq not in stored:
                found.setdefault(seq, item)
    events = 0
    seqs = sorted(found)
    for start in range(0, len(seqs), MAX_EVENTS_PER_BATCH):
        highest = RunEvent.highest_seq(run)
        batch = []
        for seq in seqs[start:start + MAX_EVENTS_PER_BATCH]:
            try:
                batch.append(parse_event(found[seq], highest))
            except ValueError as exc:
                skipped += 1
                logger.warning("run %s: reconcile skips seq %s: %s", run.pk, seq, exc)
        if batch:
            events += do_ingest_events(run, batch).stored
    return events, skipped


def nothing_new(directory: Path, highest_seq: int) -> bool:
    """No spool, and events.jsonl's last event is one the run stored: the common case of a
    run that ended while the control plane listened, told without reading the whole file
    (the driver delivers in seq order, so what it stored has no holes below its highest)."""
    if (directory / EVENT_FILES[1]).exists():
        return False
    try:
        fd = os.open(directory / EVENT_FILES[0], os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    with os.fdopen(fd, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - TAIL_BYTES))
        tail = f.read().splitlines()
    for line in reversed(tail[1:] if size > TAIL_BYTES else tail):
        try:
            item = json.loads(line)
        except ValueError:
            continue                     # a torn last line
        seq = item.get("seq") if isinstance(item, dict) else None
        return type(seq) is int and seq <= highest_seq
    return size == 0


def json_lines(path: Path) -> Iterator[object]:
    """Each line of ``path`` as JSON; None for one that is too long or not JSON. Nothing
    when the file is missing or a symlink."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return
    with os.fdopen(fd, "rb") as f:
        while line := f.readline(MAX_LINE_BYTES + 1):
            if len(line) > MAX_LINE_BYTES:
                while (rest := f.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                    pass
                yield None
            elif line.strip():
                try:
                    yield json.loads(line)
                except ValueError:    # a torn last line of a driver that died mid-write
                    yield None


def checkpoints_on_disk(run: Run, root: Path) -> tuple[int, int]:
    """Rows for finished checkpoints (state.json written) the run does not list yet:
    (made, skipped)."""
    if not root.is_dir() or root.is_symlink():
        return 0, 0
    listed = set(Checkpoint.objects.filter(run=run).values_list("step", flat=True))
    rows, skipped = [], 0
    for d in sorted(root.iterdir()):
        m = STEP_DIR.fullmatch(d.name)
        if m is None or int(m[1]) in listed or d.is_symlink() or not d.is_dir():
            continue
        state = state_of(d / "state.json")
        if state is None:
            continue                    # still being written, or not a checkpoint
        step, version, fingerprint = (state.get(k) for k in ("step", "version", "fingerprint"))
        if (step != int(m[1]) or type(version) is not int
                or not isinstance(fingerprint, str) or len(fingerprint) > MAX_TEXT_CHARS):
            skipped += 1
            logger.warning("run %s: %s/state.json does not describe step %s; not listed",
                           run.pk, d, m[1])
            continue
        rows.append(Checkpoint(
            run=run, step=step, version=version, path=str(d), fingerprint=fingerprint,
            created_at=datetime.fromtimestamp((d / "state.json").stat().st_mtime, UTC)))
    Checkpoint.objects.bulk_create(rows, ignore_conflicts=True)
    return len(rows), skipped


def state_of(path: Path) -> dict | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        raw = f.read(MAX_STATE_BYTES + 1)
    try:
        state = json.loads(raw) if len(raw) <= MAX_STATE_BYTES else None
    except ValueError:
        return None
    return state if isinstance(state, dict) else None


def runs_to_reconcile():
    """The control plane came back: the runs whose drivers may have written what it
    missed (live ones, and lost ones: a driver the control plane gave up on may have
    finished its checkpoint or its run)."""
    return Run.objects.filter(status__in=[*LIVE, RunStatus.LOST]).order_by("pk")


def do_mark_runs_lost_with_ray_head(died_at: str, how: str) -> list[tuple[Run, Reconciled]]:
    """The Ray head died (``how``: "killed by signal 9") and was started again: every run
    it held is gone. Each is reconciled first (a driver that wrote its final status ends
    as it said), then marked lost with the cause."""
    done = []
    for run in Run.objects.filter(status__in=LIVE).exclude(ray_submission_id="").order_by("pk"):
        result = do_reconcile_run(run)
        try:
            run.advance_to(RunStatus.LOST, f"the Ray head died at {died_at} ({how}); the "
                                           "stack restarted it, but the run's driver and "
                                           "actors died with it")
        except InvalidTransition as exc:
            logger.info("run %s: %s", run.pk, exc)
        done.append((run, result))
    return done
