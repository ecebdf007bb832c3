"""The control plane's ASGI app as bench/ingest.py serves it: the same application, with
each broadcast event stamped at the stages of its way to a client (unix seconds):

    committed_at   ingest's on_commit ran broadcast_events (the commit, to within it)
    published_at   the channel layer's group_send began (in the ingest process's loop)
    received_at    the first consumer of the serving process got it from the layer
    encoding_at    that consumer's queries were done and run_update began its message

A client's receipt minus ``committed_at`` is the commit -> client latency the fan-out
figures report; the stages between show where it went. With RLPLANE_BENCH_SENT_DIR set,
each process also appends a line "<run id> <seconds>" to sent-<pid>.txt there for every
live message a socket was sent: commit -> handed to the socket, the server's side of it
(the clients share the machine's cores, and their own work is in their receipts); not for
the slow clients (?slow), whose sends wait for them.
Nothing is stored stamped: the stored payloads were written before the commit.

    uvicorn bench.ingest_asgi:application
"""

import logging
import os
import time
from pathlib import Path

from channels.layers import get_channel_layer

from controlplane.asgi import application  # noqa: F401 (served; sets Django up)
from jobs import consumers
from jobs.ingest import store

_broadcast = store.broadcast_events


def broadcast_stamped(run_id: int, events: list[dict], summary: dict | None = None) -> None:
    now = time.time()
    _broadcast(run_id, [{**e, "committed_at": now} for e in events], summary)


store.broadcast_events = broadcast_stamped

_layer = get_channel_layer()
_group_send = _layer.group_send


async def group_send_stamped(group: str, message: dict) -> None:
    if message.get("type") == "run.events":
        now = time.time()
        message = {**message, "events": [{**e, "published_at": now} for e in message["events"]]}
    await _group_send(group, message)


_layer.group_send = group_send_stamped

_run_events = consumers.RunConsumer.run_events


async def run_events_stamped(self, message: dict) -> None:
    now = time.time()
    for event in message["events"]:
        event.setdefault("received_at", now)
    await _run_events(self, message)


consumers.RunConsumer.run_events = run_events_stamped

_run_update = consumers.run_update


def run_update_stamped(events: list[dict], *args, **kwargs) -> dict:
    now = time.time()
    return _run_update([{**e, "encoding_at": now} for e in events], *args, **kwargs)


consumers.run_update = run_update_stamped

_send_events = consumers.RunConsumer.send_events
_sent_dir = os.environ.get("RLPLANE_BENCH_SENT_DIR")
_sent = (Path(_sent_dir) / f"sent-{os.getpid()}.txt").open("a", buffering=1) if _sent_dir else None


async def send_events_timed(self, events: list[dict]) -> None:
    await _send_events(self, events)
    committed = events[0].get("committed_at")   # live (a backfill's are not stamped)
    if (_sent is not None and committed is not None and events[0]["seq"] > 1   # 1: warm-up
            and self.scope["query_string"] != b"slow"):
        _sent.write(f"{self.run_id} {time.time() - committed:.6f}\n")


consumers.RunConsumer.send_events = send_events_timed

# A 500's traceback in the bench's server log (Django prints it only under DEBUG).
logging.getLogger("django.request").addHandler(logging.StreamHandler())
