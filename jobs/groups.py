"""The channel groups the live pages listen on and the control plane sends to:

    run_group(id)   "run.<id>"  one run's page: its events (ingest), its alerts (lifecycle)
    RUNS_GROUP      "runs"      the runs list: one summary per ingested batch
    session_group(key)          every socket opened with one login session: closed when
                                that session logs out (jobs.apps)

    group_send(*(group, message))   from sync code, on the process's one sending loop
"""

import asyncio
import hashlib
import os
import threading

from channels.layers import get_channel_layer

RUNS_GROUP = "runs"


def run_group(run_id: int) -> str:
    return f"run.{run_id}"


def session_group(session_key: str) -> str:
    # Hashed: a group name is visible to whoever can read the channel layer's Redis.
    return "session." + hashlib.sha256(session_key.encode()).hexdigest()[:40]


# Sync code (ingest's threads, Celery tasks, a view) sends on one event loop per process,
# kept on a thread of its own: async_to_sync from a thread with none started a thread and
# a loop for each call, and the channel layer (a connection per loop) connected to Redis
# again each time, about 3 ms of ingest's CPU a batch at 100 runs, 1/10 of its server's.
SEND_TIMEOUT_S = 10.0
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_loop_pid: int | None = None
_loop_lock = threading.Lock()


def send_loop() -> asyncio.AbstractEventLoop:
    """This process's sending loop, started on first use, and again in a forked child
    (the parent's thread did not come with it) or if its thread ever ended."""
    global _loop, _thread, _loop_pid
    with _loop_lock:
        if _loop_pid != os.getpid() or _thread is None or not _thread.is_alive():
            _loop, _loop_pid = asyncio.new_event_loop(), os.getpid()
            _thread = threading.Thread(target=_loop.run_forever, name="channel-sends",
                                       daemon=True)
            _thread.start()
        return _loop


def group_send(*messages: tuple[str, dict]) -> None:
    """Send each (group, message) through the channel layer, in order, and wait for them
    (at most SEND_TIMEOUT_S: a Redis that does not answer fails the send, and the caller's
    robust on_commit logs it, rather than holding an ingest thread)."""
    future = asyncio.run_coroutine_threadsafe(send_in_order(messages), send_loop())
    try:
        future.result(SEND_TIMEOUT_S)
    except TimeoutError:
        future.cancel()
        raise


async def send_in_order(messages: tuple[tuple[str, dict], ...]) -> None:
    layer = get_channel_layer()
    if layer is None:   # no CHANNEL_LAYERS: nobody listens
        return
    for group, message in messages:
        await layer.group_send(group, message)
