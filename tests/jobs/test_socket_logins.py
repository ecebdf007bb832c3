"""The checks of the open sockets' logins (jobs.socket_logins): in the background, one per
login, and a socket closed when its session ends without a logout."""

import asyncio
import threading
import time

import pytest
from channels.db import database_sync_to_async
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session
from django.db import OperationalError
from django.utils import timezone

from jobs import socket_logins
from jobs.socket_logins import logins_alive

from .helpers import log
from .sockets import ingest, open_socket, received_until, run_async, seqs

pytestmark = pytest.mark.django_db(transaction=True)


async def streaming_then_session_deleted(run, session_cookie):
    """A socket streaming the run (seq 1 received), then every session row deleted."""
    communicator, _, _ = await open_socket(f"/ws/runs/{run.pk}/", session_cookie)
    await communicator.send_json_to({"last_seq": 0})
    await ingest(run, [log(1)])
    assert seqs(await received_until(communicator, 1)) == [1]  # logged in: streamed
    await database_sync_to_async(lambda: Session.objects.all().delete())()
    return communicator


def test_a_socket_is_closed_when_its_session_row_is_deleted_with_no_message_due(
        run, channel_layer, session_cookie, monkeypatch):
    monkeypatch.setattr(socket_logins, "REFRESH_S", 0.2)

    async def scenario():
        communicator = await streaming_then_session_deleted(run, session_cookie)
        return await communicator.receive_output(timeout=10)   # nothing else sent

    closed = run_async(scenario)

    assert (closed["type"], closed.get("code")) == ("websocket.close", 4401)


def test_a_socket_whose_session_row_is_deleted_is_closed_before_the_next_message(
        run, channel_layer, session_cookie, monkeypatch):
    monkeypatch.setattr(socket_logins, "SESSION_CHECK_S", 0.0)

    async def scenario():
        communicator = await streaming_then_session_deleted(run, session_cookie)
        await ingest(run, [log(2)])
        return await communicator.receive_output(timeout=10)

    closed = run_async(scenario)

    assert (closed["type"], closed.get("code")) == ("websocket.close", 4401)


def test_the_sockets_of_one_login_wait_for_one_check_between_them(
        run, channel_layer, session_cookie, monkeypatch):
    """Three sockets of one login, each due a check before the message: one read (each
    socket read the session itself before)."""
    monkeypatch.setattr(socket_logins, "SESSION_CHECK_S", 0.0)
    monkeypatch.setattr(socket_logins, "REFRESH_S", 300.0)
    asked, checked, gate = [], [], threading.Event()
    real_alive = socket_logins.Logins.alive

    async def counted_alive(self, login):
        asked.append(login)
        return await real_alive(self, login)

    def held_check(logins):
        checked.append(list(logins))
        if gate.is_set():   # the live message: held until all three sockets asked
            deadline = time.monotonic() + 10
            while len(asked) < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
        return logins_alive(logins)

    monkeypatch.setattr(socket_logins.Logins, "alive", counted_alive)
    monkeypatch.setattr(socket_logins, "logins_alive", held_check)

    async def scenario():
        sockets = [(await open_socket(f"/ws/runs/{run.pk}/", session_cookie))[0]
                   for _ in range(3)]
        for communicator in sockets:
            await communicator.send_json_to({"last_seq": 0})
        await ingest(run, [log(1)])
        for communicator in sockets:
            await received_until(communicator, 1)
        await asyncio.sleep(1.0)   # the checks before those messages are done
        asked.clear()
        checked.clear()
        gate.set()
        await ingest(run, [log(2)])
        received = await asyncio.gather(*(received_until(c, 2) for c in sockets))
        for communicator in sockets:
            await communicator.disconnect(timeout=10)
        return received

    received = run_async(scenario)

    assert [[m["last_seq"] for m in messages] for messages in received] == [[2]] * 3
    assert len(checked) == 1 and len(checked[0]) == 1


def test_a_check_that_fails_holds_the_message_and_the_next_one_fills_the_gap(
        run, channel_layer, session_cookie, monkeypatch):
    """The database away during a check: the socket stays open, sends nothing unchecked,
    and the next message (checked) brings the one it held back."""
    monkeypatch.setattr(socket_logins, "SESSION_CHECK_S", 0.0)
    failing = threading.Event()

    def check(logins):
        if failing.is_set():
            raise OperationalError("the database is away")
        return logins_alive(logins)

    monkeypatch.setattr(socket_logins, "logins_alive", check)

    async def scenario():
        communicator, _, _ = await open_socket(f"/ws/runs/{run.pk}/", session_cookie)
        await communicator.send_json_to({"last_seq": 0})
        await ingest(run, [log(1)])
        await received_until(communicator, 1)
        failing.set()
        await ingest(run, [log(2)])
        held = await communicator.receive_nothing(timeout=0.5)
        failing.clear()
        await ingest(run, [log(3)])
        messages = await received_until(communicator, 3)
        await communicator.disconnect(timeout=10)
        return held, messages

    held, messages = run_async(scenario)

    assert held
    assert seqs(messages) == [2, 3]


def test_a_login_is_alive_while_its_session_row_exists_unexpired_for_that_user(
        django_user_model):
    user, other = (django_user_model.objects.create_user(name) for name in ("a", "b"))

    def session(user_pk: int, expired: bool = False) -> str:
        store = SessionStore()
        store["_auth_user_id"] = str(user_pk)
        store.create()
        if expired:
            Session.objects.filter(session_key=store.session_key).update(
                expire_date=timezone.now() - timezone.timedelta(seconds=1))
        return store.session_key

    alive, expired, deleted = session(user.pk), session(user.pk, True), session(user.pk)
    Session.objects.filter(session_key=deleted).delete()
    logins = [(alive, str(user.pk)), (alive, str(other.pk)), (expired, str(user.pk)),
              (deleted, str(user.pk))]

    assert logins_alive(logins) == {(alive, str(user.pk))}
