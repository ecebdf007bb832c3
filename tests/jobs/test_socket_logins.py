"""The checks of the open sockets' logins (jobs.socket_logins): in the background, one per
login, and a socket closed when its session ends without a logout."""

import asyncio
import threading
import time

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.auth.models import User
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session
from django.db import OperationalError
from django.test import override_settings
from django.utils import timezone

from jobs import socket_logins
from jobs.socket_logins import logins_alive

from .helpers import log
from .sockets import ingest, open_socket, received_until, run_async, seqs

pytestmark = pytest.mark.django_db(transaction=True)
MODEL_BACKEND = "django.contrib.auth.backends.ModelBackend"


def delete_sessions():
    Session.objects.all().delete()


def deactivate_viewer():
    User.objects.filter(username="viewer").update(is_active=False)


def change_viewers_password():
    viewer = User.objects.get(username="viewer")
    viewer.set_unusable_password()   # a new password: this session's hash no longer matches
    viewer.save()


async def streaming_then_login_ended(run, session_cookie, end=delete_sessions):
    """A socket streaming the run (seq 1 received), then its login ended (``end``: every
    session row deleted)."""
    communicator, _, _ = await open_socket(f"/ws/runs/{run.pk}/", session_cookie)
    await communicator.send_json_to({"last_seq": 0})
    await ingest(run, [log(1)])
    assert seqs(await received_until(communicator, 1)) == [1]  # logged in: streamed
    await database_sync_to_async(end)()
    return communicator


@pytest.mark.parametrize("end", [delete_sessions, deactivate_viewer, change_viewers_password])
def test_a_socket_is_closed_when_its_login_ends_with_no_message_due(
        run, channel_layer, session_cookie, monkeypatch, end):
    monkeypatch.setattr(socket_logins, "REFRESH_S", 0.2)

    async def scenario():
        communicator = await streaming_then_login_ended(run, session_cookie, end)
        return await communicator.receive_output(timeout=10)   # nothing else sent

    closed = run_async(scenario)

    assert (closed["type"], closed.get("code")) == ("websocket.close", 4401)


def test_a_socket_whose_session_row_is_deleted_is_closed_before_the_next_message(
        run, channel_layer, session_cookie, monkeypatch):
    monkeypatch.setattr(socket_logins, "SESSION_CHECK_S", 0.0)

    async def scenario():
        communicator = await streaming_then_login_ended(run, session_cookie)
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


def test_a_login_is_alive_while_its_session_row_exists_unexpired_and_logs_that_user_in(
        django_user_model, settings):
    user, other, gone = (django_user_model.objects.create_user(name) for name in "abc")

    def session(user, expired: bool = False, **overrides) -> str:
        """A session as login() stores it, with ``overrides`` of its keys."""
        store = SessionStore()
        store.update({SESSION_KEY: str(user.pk), BACKEND_SESSION_KEY: MODEL_BACKEND,
                      HASH_SESSION_KEY: user.get_session_auth_hash(), **overrides})
        store.create()
        if expired:
            Session.objects.filter(session_key=store.session_key).update(
                expire_date=timezone.now() - timezone.timedelta(seconds=1))
        return store.session_key

    alive, expired, deleted = session(user), session(user, True), session(user)
    Session.objects.filter(session_key=deleted).delete()
    settings.SECRET_KEY_FALLBACKS = ["an older secret key"]
    with override_settings(SECRET_KEY="an older secret key"):
        rotated = session(user)   # hashed under the secret before the rotation: kept
    unhashed = session(user, **{HASH_SESSION_KEY: ""})
    elsewhere = session(user, **{BACKEND_SESSION_KEY: "some.backend.NotConfigured"})
    before_password = session(other)
    other.set_unusable_password()   # a new password (no hasher's rounds in a test)
    other.save()
    deactivated = session(gone)
    django_user_model.objects.filter(pk=gone.pk).update(is_active=False)
    logins = [(alive, str(user.pk)), (alive, str(other.pk)), (expired, str(user.pk)),
              (deleted, str(user.pk)), (rotated, str(user.pk)), (unhashed, str(user.pk)),
              (elsewhere, str(user.pk)), (before_password, str(other.pk)),
              (deactivated, str(gone.pk))]

    assert logins_alive(logins) == {(alive, str(user.pk)), (rotated, str(user.pk))}
