"""The history the rules read, kept per run by the process that evaluates them, and read
from the database incrementally.

    recent_history(run)   -> RunHistory of the run's last HISTORY_LIMIT .. HISTORY_LIMIT
                             + SLACK history events (metrics, spans, syncs) in seq order

    first evaluation of a run in this process, or its cached one is no longer valid
        -> the last HISTORY_LIMIT history events (read)
    later ones -> only the history events past the highest seq already read, added to the
        cached RunHistory (the rules' derived values stay cached with it)

A cached history is valid while the run row's ``created_at`` (a reused id: a test database)
and ``history_rewrites`` (bumped by ingest when it stores a history event at or below the
run's highest seq: out of order, so a read past the highest seq would miss it) are those it
was read under. Once it holds HISTORY_LIMIT + SLACK events, the next evaluation adds what
is new and keeps the last HISTORY_LIMIT (RunHistory.keep_last: equal to reading them
again, without the database or decoding their payloads). So the window the rules see moves
by SLACK events at a time instead of one, and a long run's evaluation reads only what is
new: the debounced evaluation runs about once a batch, and on a run of 2,360 steps it took
84-90 ms reading all of them, 16-19 ms reading what was new (bench/alert_evaluation.py,
PostgreSQL); reading the last HISTORY_LIMIT again every SLACK events was most of the
payloads an evaluation decoded.

What an evaluation read goes back into the cache when its transaction commits: a rolled
back one leaves nothing behind (a later read must not see events that were not stored).
Entries are kept least recently evaluated first out, to CACHE_EVENTS events in all.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from functools import partial

from django.db import transaction
from django.db.models import QuerySet, TextField
from django.db.models.functions import Cast

from jobs import fastjson
from jobs.alerts.history import HISTORY_EVENTS, RunHistory
from jobs.models import Run, RunEvent

HISTORY_LIMIT = 4000   # the history events a (re)read takes (hundreds of steps)
SLACK = HISTORY_LIMIT // 2   # added to a cached history before it is read again
# A process's cached events, all runs together: ~35 long runs, ~100 MB at 530 bytes an event
# (a span per phase and 64 metric values a step, bench/ingest.py's, tracemalloc).
CACHE_EVENTS = 200_000


@dataclass
class Recent:
    created_at: datetime
    rewrites: int
    history: RunHistory
    top: int      # the highest seq read
    events: int   # the history events in ``history``

    def valid_for(self, run: Run) -> bool:
        return self.created_at == run.created_at and self.rewrites == run.history_rewrites


_cache: OrderedDict[int, Recent] = OrderedDict()
_lock = threading.Lock()   # request threads evaluate too (RLPLANE_ALERT_DEBOUNCE_S = 0)


def recent_history(run: Run) -> RunHistory:
    """The run's recent history (module docstring); ``run`` as just read, under its lock."""
    with _lock:
        entry = _cache.pop(run.pk, None)   # no other evaluation of the run uses it meanwhile
    if entry is None or not entry.valid_for(run):
        entry = read(run)
    else:
        full = entry.events >= HISTORY_LIMIT + SLACK
        for seq, payload in payloads(history_rows(run).filter(seq__gt=entry.top)
                                     .order_by("seq")):
            entry.history.add(payload)
            entry.top, entry.events = seq, entry.events + 1
        if full:   # what a read of the last HISTORY_LIMIT would be, from what it holds
            entry.history.keep_last(HISTORY_LIMIT)
            entry.events = min(entry.events, HISTORY_LIMIT)
    latest = RunEvent.objects.filter(run=run).order_by("-seq").values_list("ts", flat=True)
    entry.history.last_ts = max(entry.history.last_ts, latest.first() or 0.0)
    transaction.on_commit(partial(keep, run.pk, entry))
    return entry.history


def read(run: Run) -> Recent:
    rows = list(payloads(history_rows(run).order_by("-seq")[:HISTORY_LIMIT]))
    h = RunHistory.of(payload for _, payload in reversed(rows))
    return Recent(created_at=run.created_at, rewrites=run.history_rewrites, history=h,
                  top=rows[0][0] if rows else 0, events=len(rows))


def history_rows(run: Run) -> QuerySet:
    """(seq, payload as JSON text) of the run's history events."""
    return (RunEvent.objects.filter(run=run, type__in=HISTORY_EVENTS)
            .annotate(text=Cast("payload", TextField())).values_list("seq", "text"))


def payloads(rows: Iterable[tuple[int, str]]) -> Iterator[tuple[int, dict]]:
    """(seq, payload) of history_rows, decoded by jobs.fastjson: the JSONField's own
    json.loads was a third of the alert worker's CPU at 100 runs."""
    for seq, text in rows:
        yield seq, fastjson.loads(text)


def keep(run_id: int, entry: Recent) -> None:
    with _lock:
        _cache[run_id] = entry
        total = sum(e.events for e in _cache.values())
        while total > CACHE_EVENTS and len(_cache) > 1:
            _, dropped = _cache.popitem(last=False)
            total -= dropped.events


def forget() -> None:
    """Drop every cached history (tests)."""
    with _lock:
        _cache.clear()
