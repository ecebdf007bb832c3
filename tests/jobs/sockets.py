"""Websocket clients for the tests of the live sockets: channels' WebsocketCommunicator
through the real ASGI stack (origin check, session auth, routing)."""

import sys
import types
from pathlib import Path

import channels
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async

from controlplane.asgi import application
from jobs.ingest.store import do_ingest_events


def websocket_communicator_class():
    """channels' own WebsocketCommunicator. Its package __init__ also imports daphne (for
    ChannelsLiveServerTestCase, unused here), which this project does not install; then
    the package is registered bare, so its websocket module loads on its own."""
    try:
        from channels.testing import WebsocketCommunicator
    except ModuleNotFoundError as exc:
        if exc.name != "daphne":
            raise
        package = types.ModuleType("channels.testing")
        package.__path__ = [str(Path(channels.__file__).parent / "testing")]
        sys.modules["channels.testing"] = package
        from channels.testing.websocket import WebsocketCommunicator
    return WebsocketCommunicator


WebsocketCommunicator = websocket_communicator_class()

ORIGIN = (b"origin", b"http://localhost")
HOST = (b"host", b"localhost")


def run_async(scenario):
    return async_to_sync(scenario)()


ingest = database_sync_to_async(do_ingest_events)


async def open_socket(path, *headers):
    communicator = WebsocketCommunicator(application, path, headers=[ORIGIN, HOST, *headers])
    connected, code = await communicator.connect(timeout=10)
    return communicator, connected, code


async def received_until(communicator, last_seq) -> list[dict]:
    """Every message up to the one that carries ``last_seq``."""
    messages = []
    while not messages or messages[-1]["last_seq"] < last_seq:
        messages.append(await communicator.receive_json_from(timeout=20))
    return messages


def seqs(messages) -> list[int]:
    return [event["seq"] for message in messages for event in message["events"]]
