"""Websockets for the live pages. Login required: an anonymous socket is closed (4401).

    ws/runs/<id>/   client -> {"last_seq": N}
                    server -> {"last_seq", "events", "charts", "swap", "append", "marks",
                               "progress"}, ...  (progress: the header's step and the
                              clock its elapsed and ETA tick from, after metrics or a
                              status, else null; then swap holds the health strip too)
                              {"alerts": {"alert-<id>": html}, "swap": {"run-health":
                              html}}  (after the backfill, the run's alerts; then each
                              alert whose state changed; with the health strip)
                              {"logs": {"run-logs": html}}  a launched command's new output
                              lines (jobs/runs/job_logs.py: seqs below 0, not in the stream)
    ws/runs/        server -> {"run_id", "status", "step", "reward_mean", "step_s", "held_out",
                              "swap"}

A run socket joins the group ``run.<id>`` before it reads the database, and ingest
announces events only after they commit, so every event is either in the backfill or in
a later group message (or both). The consumer handles one message at a time and remembers
the last seq it sent: anything at or below it is dropped, and a live message that starts
past ``last_sent + 1`` (two ingests whose broadcasts crossed) is filled from the database.
So a client sees each seq once, in order, with no gap.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.template.loader import render_to_string
from redis.exceptions import RedisError

from jobs import charts
from jobs.alerts.views import render_health, run_alerts
from jobs.auth import is_operator
from jobs.groups import RUNS_GROUP, run_group, session_group
from jobs.models import Alert, Run, RunEvent
from jobs.models.controls import display_status
from jobs.queries.run_page import REPLACED, clock_after, log_lines, run_progress
from jobs.socket_logins import logins

BACKFILL_CHUNK = 500  # events per message while catching up

logger = logging.getLogger(__name__)


def run_update(events: list[dict], status: tuple[str, str] | None,
               others: bool = False, progress: dict | None = None) -> dict:
    """One message for the run page: raw events, extendTraces data, HTML fragments, a
    chart mark per live control applied, and the header's progress clock
    (run_page.progress_clock); ``others`` for an external run's page, which charts the
    names no built-in chart reads too."""
    steps = [(e["step"], e["values"]) for e in events if e["type"] == "metrics.append"]
    spans = [e for e in events if e["type"] == "span"]
    updates = charts.metric_updates(steps, others)
    timeline = charts.timeline_update(spans)
    if timeline:
        updates["timeline"] = timeline
    append = {}
    logs = log_lines(events)
    if logs:
        append["run-logs"] = render_to_string("jobs/_log_lines.html", {"logs": logs})
    checkpoints = [e for e in events if e["type"] == "checkpoint.saved"]
    if checkpoints:
        append["run-checkpoints"] = render_to_string(
            "jobs/_checkpoint_rows.html", {"checkpoints": checkpoints})
    swap = {}
    if status is not None:
        swap["run-status"] = render_to_string(
            "jobs/_status_badge.html", {"status": status[0], "reason": status[1],
                                        "badge_id": "run-status"})
        swap["run-status-reason"] = render_to_string(
            "jobs/_status_reason.html", {"status": status[0], "reason": status[1]})
    marks = charts.control_marks((e["step"], e["kind"], e["value"]) for e in events
                                 if e["type"] == "control.applied")
    marks += charts.replacement_marks(e for e in events if e["type"] == REPLACED)
    return {"last_seq": events[-1]["seq"], "events": events, "charts": updates,
            "append": append, "swap": swap, "marks": marks, "progress": progress}


SHARED_FOR_S = 2.0  # how long one socket's message is kept for the run's other sockets
# How old the header clock and health strip in a live message may be before a new read
# starts; the message goes with the last read meanwhile. A run's progress is a handful of
# queries and a template on the one thread every consumer's queries wait for: read per
# broadcast, 11 runs broadcasting 10 times a second queued seconds of them there, and
# read once a second, every watcher of the run still waited for each read (hundreds of
# ms under ingest load; bench/ingest.py --fanout).
PROGRESS_FRESH_S = 1.0
_shared: dict[tuple, asyncio.Future] = {}
# run id -> (monotonic time a read began, (clock, health strip), the loop it ran on)
_progress: dict[int, tuple[float, tuple[dict, str], asyncio.AbstractEventLoop]] = {}


def shared_future(key: tuple, make: Callable[[], Awaitable[Any]],
                  keep_s: float = SHARED_FOR_S) -> asyncio.Future:
    """``make()``'s task, made once per ``key`` in this process for every socket that
    asks within ``keep_s`` after it is done: a broadcast reaches each watcher of a run at
    once, and each made its own message (a few queries, the charts' data, the JSON) --
    100 watchers cost 100 times one, on the one thread every consumer's queries wait for."""
    loop = asyncio.get_running_loop()
    future = _shared.get(key)
    if future is None or future.get_loop() is not loop:
        future = _shared[key] = loop.create_task(make())
        future.add_done_callback(lambda f: loop.call_later(
            keep_s if not f.cancelled() and f.exception() is None else 0,
            forget, key, f))
    return future


async def shared(key: tuple, make: Callable[[], Awaitable[Any]],
                 keep_s: float = SHARED_FOR_S) -> Any:
    return await asyncio.shield(shared_future(key, make, keep_s))


def forget(key: tuple, future: asyncio.Future) -> None:
    if _shared.get(key) is future:
        del _shared[key]


class SessionBoundConsumer(AsyncJsonWebsocketConsumer):
    """A socket that lives no longer than the login it was opened with: logging out
    closes it (4401), as the pages it streams would then redirect to the login. A login
    that ends without a logout (its session row deleted by an admin or clearsessions,
    expired; the password changed, the user deactivated) is noticed by the process's
    checks of its sockets' logins (jobs.socket_logins): within their REFRESH_S, and before
    a message if the last check is SESSION_CHECK_S old.

    Leaving the groups is best effort: a tab closing while Redis is slow must not log a
    traceback (the membership expires with the channel layer's group_expiry)."""

    async def dispatch(self, message):
        """channels' dispatch without its ``aclose_old_connections()`` before every
        handler: that is a ``sync_to_async`` onto the one thread every consumer's queries
        run on, so each message to each socket queued there behind the others' queries (a
        run's progress read, a session check): 100 watchers of a run under ingest load
        waited seconds for it (bench/ingest.py --fanout, py-spy). Every query here
        goes through ``database_sync_to_async``, which closes stale connections itself,
        on that thread, before and after each."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def __call__(self, scope, receive, send):
        """A socket's login leaves the process's checks however the socket ends (a
        handler that raised never reaches disconnect)."""
        try:
            await super().__call__(scope, receive, send)
        finally:
            if hasattr(self, "login"):
                logins.leave(self.login, self.channel_name)

    async def still_logged_in(self) -> bool:
        """False (and the socket closed) once the session is gone or belongs to no one;
        False, the socket kept, while the check fails (its next message checks again)."""
        try:
            alive = await logins.alive(self.login)
        except Exception:
            logger.warning("websocket %s: its login not checked, the message not sent",
                           self.channel_name, exc_info=True)
            return False
        if not alive:
            await self.close(code=4401)
        return alive

    async def discard(self, group: str) -> None:
        try:
            await self.channel_layer.group_discard(group, self.channel_name)
        except (RedisError, OSError) as exc:
            logger.warning("websocket %s left %s without Redis's answer (%r)",
                           self.channel_name, group, exc)

    async def join_session(self) -> bool:
        """False (and the socket closed) for an anonymous user."""
        session = self.scope.get("session")
        if not self.scope["user"].is_authenticated or session is None or not session.session_key:
            await self.close(code=4401)
            return False
        self.session_group = session_group(session.session_key)
        self.login = (session.session_key, str(self.scope["user"].pk))
        logins.join(self.login, self.channel_name)
        await self.channel_layer.group_add(self.session_group, self.channel_name)
        return True

    async def leave_session(self) -> None:
        if hasattr(self, "session_group"):
            await self.discard(self.session_group)

    async def session_ended(self, message):
        await self.close(code=4401)


class RunConsumer(SessionBoundConsumer):
    last_sent: int | None = None  # None until the client said where it is

    async def connect(self):
        if not await self.join_session():
            return
        self.run_id = int(self.scope["url_route"]["kwargs"]["run_id"])
        run = await database_sync_to_async(Run.objects.filter(pk=self.run_id).first)()
        if run is None:
            await self.close(code=4404)
            return
        self.external = run.is_external
        # The role the alert rows are rendered for (their buttons), read once per socket.
        self.operator = await database_sync_to_async(is_operator)(self.scope["user"])
        self.group = run_group(self.run_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code):
        await self.leave_session()
        if hasattr(self, "group"):
            await self.discard(self.group)

    async def receive_json(self, content, **kwargs):
        last_seq = content.get("last_seq") if isinstance(content, dict) else None
        if not isinstance(last_seq, int) or isinstance(last_seq, bool) or last_seq < 0:
            await self.send_json({"error": 'send {"last_seq": N}, N >= 0 (0 for everything)'})
            await self.close(code=4400)
            return
        if self.last_sent is not None:
            return  # already streaming; the position is ours to track now
        self.last_sent = last_seq
        await self.send_backfill()
        await self.run_alerts({"alert_ids": None, "broadcast": None})

    async def run_events(self, message):
        if self.last_sent is None:
            return  # committed before it was announced: the backfill will include it
        if not await self.still_logged_in():
            return
        events = [e for e in message["events"] if e["seq"] > self.last_sent]
        if not events:
            return
        if events[0]["seq"] != self.last_sent + 1:
            await self.send_backfill()  # an earlier broadcast may still be on its way
            return
        await self.send_events(events)

    async def run_job_logs(self, message):
        """A launched command's output lines: appended to the log panel as they come. They
        are not in the seq stream (their seqs are below 0), so a socket that missed some
        gets them with the next page load, not with a backfill."""
        if self.last_sent is None:
            return
        logs = log_lines(message["events"])
        await self.send_json({"logs": {"run-logs": render_to_string(
            "jobs/_log_lines.html", {"logs": logs})}})

    async def run_alerts(self, message):
        """Alert rows rendered for this socket's user (operators get the buttons), once
        per broadcast and role for the run's sockets in this process: an alert that
        opened made each of 100 sockets render it on the one thread every consumer's
        queries wait for, and their run's events waited a second behind it."""
        if self.last_sent is None:
            return  # the page rendered them; the first message resends them all anyway
        if not await self.still_logged_in():
            return
        render = database_sync_to_async(partial(self.render_alerts, message["alert_ids"]))
        if message.get("broadcast") is None:   # this socket's first: all of them
            alerts, health = await render()
        else:
            alerts, health = await shared(
                ("alerts", self.run_id, message["broadcast"], self.operator), render)
        if alerts:
            await self.send_json({"alerts": alerts, "swap": {"run-health": health}})

    def render_alerts(self, alert_ids: list[int] | None) -> tuple[dict[str, str], str]:
        """The rows of these alerts (all the run's for None) and the health strip."""
        alerts = Alert.objects.filter(run_id=self.run_id)
        alerts = run_alerts(self.run_id) if alert_ids is None else alerts.filter(pk__in=alert_ids)
        rows = {f"alert-{a.pk}": render_to_string("jobs/alerts/_alert.html",
                                                  {"alert": a, "operator": self.operator})
                for a in alerts}
        return rows, render_health(Run.objects.get(pk=self.run_id)) if rows else ""

    async def send_backfill(self):
        while True:
            events = await database_sync_to_async(self.backfill_chunk)(self.last_sent)
            if events:
                await self.send_events(events)
            if len(events) < BACKFILL_CHUNK:
                return

    def backfill_chunk(self, after_seq: int) -> list[dict]:
        rows = RunEvent.backfill(self.run_id, after_seq).values_list("payload", flat=True)
        return list(rows[:BACKFILL_CHUNK])

    async def send_events(self, events: list[dict]):
        key = (self.run_id, events[0]["seq"], events[-1]["seq"])
        await self.send(text_data=await shared(key, lambda: self.encode_update(events)))
        self.last_sent = events[-1]["seq"]

    async def encode_update(self, events: list[dict]) -> str:
        """The message for these events, as JSON: the same for every socket on the run
        (the user's role shows only in alert rows, sent apart)."""
        status = progress = health = None
        if any(e["type"] in ("run.status", "control.applied") for e in events):
            status = await database_sync_to_async(self.current_status)()
        if any(e["type"] == "run.status" for e in events):
            progress, health = await self.read_progress()
        elif any(e["type"] == "metrics.append" for e in events):
            progress, health = await self.recent_progress()
            progress = clock_after(progress, events, self.external, time.time())
        update = run_update(events, status, self.external, progress)
        if health is not None:
            update["swap"]["run-health"] = health
        return await self.encode_json(update)

    async def recent_progress(self) -> tuple[dict, str]:
        """The run's last progress read in this process, a new read started (shared by
        the run's sockets) once it is PROGRESS_FRESH_S old; the first one waits for it."""
        loop = asyncio.get_running_loop()
        read_at, progress, read_on = _progress.get(self.run_id, (0.0, None, None))
        if progress is None or read_on is not loop:
            return await shared(("progress", self.run_id), self.read_progress, 0)
        if time.monotonic() - read_at > PROGRESS_FRESH_S:
            shared_future(("progress", self.run_id), self.read_progress, 0)
        return progress

    async def read_progress(self) -> tuple[dict, str]:
        """Read now (a final status must stop the page's clock), and kept for the run's
        next messages."""
        began = time.monotonic()
        progress = await database_sync_to_async(self.progress_clock)()
        if began > _progress.get(self.run_id, (0.0,))[0]:   # not over a later read's
            _progress[self.run_id] = (began, progress, asyncio.get_running_loop())
        return progress

    def progress_clock(self) -> tuple[dict, str]:
        """Read after the events committed, so a final status stops the page's clock; and
        the health strip as the evaluation of those events left it."""
        run = Run.objects.get(pk=self.run_id)
        return run_progress(run)["clock"], render_health(run)

    def current_status(self) -> tuple[str, str]:
        """The control plane's status (what the badge shows: "paused" while the driver
        holds), not the engine's word."""
        run = Run.objects.get(pk=self.run_id)
        return display_status(run), run.status_reason


class RunsConsumer(SessionBoundConsumer):
    """The runs list: one summary per ingested batch, for rows to update in place."""

    async def connect(self):
        if not await self.join_session():
            return
        await self.channel_layer.group_add(RUNS_GROUP, self.channel_name)
        self.joined = True
        await self.accept()

    async def disconnect(self, code):
        await self.leave_session()
        if getattr(self, "joined", False):
            await self.discard(RUNS_GROUP)

    async def runs_summary(self, message):
        if not await self.still_logged_in():
            return
        run_id = message["run_id"]
        await self.send_json({**{k: v for k, v in message.items() if k != "type"},
                              "swap": {f"run-{run_id}-status": status_badge(
                                  run_id, message["status"])}})


@functools.lru_cache(maxsize=4096)
def status_badge(run_id: int, status: str) -> str:
    """A runs-list row's badge, rendered once per (run, status) in a process: per socket
    and batch it was ~0.18 ms of the event loop each, and 10 people watching the list
    while 100 runs ingest would render ~2,000 a second."""
    return render_to_string("jobs/_status_badge.html", {"status": status, "run_id": run_id})
