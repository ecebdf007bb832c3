"""The logins this process's websockets were opened with, kept checked in the background.

A socket lives no longer than the login it was opened with. Logging out closes it at once
(jobs.apps: the session's group). A login that ends otherwise (its session row deleted by
an admin or clearsessions, expired; the user's password changed or the user deactivated,
which Django's own check of a request's session refuses too) is found by a check:

- every REFRESH_S one task per process checks all the logins of its open sockets, in one
  read on a thread of its own, and tells the sockets of a login that ended (session.ended);
- no message goes to a socket whose login was last found alive more than SESSION_CHECK_S
  ago (the refresher fell behind, or SESSION_CHECK_S is smaller) before a new check, one
  per login however many of its sockets wait for it (so a message may go on a check that
  began, one read earlier, before it arrived). A check that fails (the database away)
  sends nothing: the socket's next message checks again, and fills the gap.

Each socket used to check its own login before a message once its last check was
SESSION_CHECK_S old, so about one message in ten seconds waited for the read: under ingest
load, a process's 50 watchers of a run queued 50 reads on the check thread, and that
message reached the last of them hundreds of ms late (bench/ingest.py --fanout).
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from importlib import import_module

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth import (
    BACKEND_SESSION_KEY,
    HASH_SESSION_KEY,
    SESSION_KEY,
    get_user_model,
    load_backend,
)
from django.contrib.sessions.backends.db import SessionStore as DbSessionStore
from django.utils import timezone
from django.utils.crypto import constant_time_compare
from redis.exceptions import RedisError

SESSION_CHECK_S = 10.0  # how stale "the login still exists" may be before a message goes
REFRESH_S = 4.0         # how often the open sockets' logins are checked meanwhile

Login = tuple[str, str]   # (session key, the user's pk as the session stores it)

logger = logging.getLogger(__name__)
checks = ThreadPoolExecutor(1, thread_name_prefix="ws-session-check")


def logins_alive(logins: list[Login]) -> set[Login]:
    """Those of ``logins`` whose session still exists, still belongs to that user, and
    would still log them in: what django.contrib.auth.get_user checks of a request's
    session (its backend still configured, the user one it lets in: active; the session's
    hash of the password still the user's, so a password change or a deactivation ends
    the sockets too). One read for the database's session engines (a load per session
    for the others), then a user's read per user."""
    store_class = import_module(settings.SESSION_ENGINE).SessionStore
    keys = {key for key, _ in logins}
    if issubclass(store_class, DbSessionStore):   # db and cached_db: the row decides
        rows = store_class.get_model_class().objects.filter(
            session_key__in=keys, expire_date__gt=timezone.now())
        data = {row.session_key: store_class().decode(row.session_data) for row in rows}
    else:
        data = {key: store_class(session_key=key).load() for key in keys}
    users: dict[tuple[str, str], object] = {}
    alive = set()
    for key, user in logins:
        session = data.get(key, {})
        backend = session.get(BACKEND_SESSION_KEY)
        if session.get(SESSION_KEY) != user or backend not in settings.AUTHENTICATION_BACKENDS:
            continue
        if (backend, user) not in users:   # None: the backend lets that user in no more
            users[backend, user] = load_backend(backend).get_user(
                get_user_model()._meta.pk.to_python(user))
        if logs_in(users[backend, user], session.get(HASH_SESSION_KEY)):
            alive.add((key, user))
    return alive


def logs_in(user, session_hash: str | None) -> bool:
    """Whether a session with ``session_hash`` logs ``user`` in (get_user's check, the
    SECRET_KEY_FALLBACKS' hashes included). Not get_user itself: it writes to the
    session it checks (flushes it on a mismatch, cycles its key on a fallback's match),
    which a background check of other people's sockets must not do."""
    if user is None:
        return False
    if not hasattr(user, "get_session_auth_hash"):
        return True
    return bool(session_hash) and any(
        constant_time_compare(session_hash, known) for known in
        (user.get_session_auth_hash(), *user.get_session_auth_fallback_hash()))


class Logins:
    """The open sockets' logins on one event loop (a server process has one; each test
    its own, so the state starts again on a new loop)."""

    def __init__(self):
        self.loop: asyncio.AbstractEventLoop | None = None

    def here(self) -> None:
        loop = asyncio.get_running_loop()
        if self.loop is not loop:
            self.loop = loop
            self.sockets: dict[Login, set[str]] = {}   # login -> its sockets' channels
            self.alive_at: dict[Login, float] = {}     # when a check last began that found it
            self.checking: dict[Login, asyncio.Task] = {}
            self.refresher: asyncio.Task | None = None

    def join(self, login: Login, channel: str) -> None:
        """A socket opened: its handshake loaded the session just now (the auth
        middleware), which counts as a check."""
        self.here()
        self.sockets.setdefault(login, set()).add(channel)
        self.alive_at.setdefault(login, time.monotonic())
        if self.refresher is None or self.refresher.done():
            self.refresher = self.loop.create_task(self.refresh())

    def leave(self, login: Login, channel: str) -> None:
        self.here()
        channels = self.sockets.get(login, set())
        channels.discard(channel)
        if not channels:
            self.sockets.pop(login, None)
            self.alive_at.pop(login, None)
        if not self.sockets and self.refresher is not None:
            self.refresher.cancel()
            self.refresher = None

    async def alive(self, login: Login) -> bool:
        """Whether a message may go: at once while the last check is fresh, else after
        one more (shared by the login's sockets)."""
        self.here()
        if time.monotonic() - self.alive_at.get(login, float("-inf")) < SESSION_CHECK_S:
            return True
        task = self.checking.get(login)
        if task is None:
            task = self.checking[login] = self.loop.create_task(self.check([login]))
            task.add_done_callback(lambda _: self.checking.pop(login, None))
        return login in await asyncio.shield(task)

    async def check(self, logins: list[Login]) -> set[Login]:
        began = time.monotonic()
        alive = await database_sync_to_async(partial(logins_alive, logins),
                                             thread_sensitive=False, executor=checks)()
        for login in logins:
            if login not in alive:
                self.alive_at.pop(login, None)   # its next message checks again
            elif login in self.sockets:
                self.alive_at[login] = max(self.alive_at.get(login, began), began)
        return alive

    async def refresh(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_S)
            try:
                await self.close_ended()
            except Exception:   # the database away: each message checks for itself
                logger.exception("the websockets' logins were not checked")

    async def close_ended(self) -> None:
        logins = list(self.sockets)
        alive = await self.check(logins)
        ended = [channel for login in logins if login not in alive
                 for channel in self.sockets.get(login, ())]
        for channel in ended:
            try:
                await get_channel_layer().send(channel, {"type": "session.ended"})
            except (RedisError, OSError):   # its next message checks again
                logger.warning("websocket %s not told its login ended", channel)


logins = Logins()
