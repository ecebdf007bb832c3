"""The fan-out bench's websocket clients (bench/ingest.py --fanout starts them in their
own processes): real clients on ws/runs/<id>/, each timing every event from its commit
(``committed_at``, stamped by bench/ingest_asgi.py) to its receipt, with the stages
between (STAGES), and slow clients that stop reading."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import socket
import time
from pathlib import Path

QUIET_S, LATE_S = 3.0, 60.0   # a client's wait for late deliveries after the probes end
# (the last probe answered: every probe committed, so one not delivered by then is missed)
# The stamps bench/ingest_asgi.py puts on an event on its way, in order; a delivery's
# stage i is stamp i+1 - stamp i, the last one's end the client's receipt.
STAMPS = ("committed_at", "published_at", "received_at", "encoding_at")
STAGES = ("commit -> group_send", "group_send -> consumer", "consumer -> encoding",
          "encoding -> client")


def watch(port: int, cookie: str, groups: list[tuple[str, list[int], int]], slow: int,
          slow_run: int, ready, start, probed, results, nice: int = 0) -> None:
    """A client process: ``groups`` of (name, run ids, clients per run); ``slow`` clients
    on ``slow_run`` that stop reading; ``probed`` is set once every probe was answered;
    ``nice``: its CPU weight as a session of its own (bench/ingest.py --ws-nice).
    Puts {group: [latency s, ...]} and the counts."""
    if nice:
        os.setsid()
        Path("/proc/self/autogroup").write_text(str(nice))
    try:
        results.put(asyncio.run(watch_async(port, cookie, groups, slow, slow_run, ready,
                                            start, probed)))
    except BaseException as exc:  # reported by the parent
        results.put({"error": repr(exc)})
        raise


async def watch_async(port, cookie, groups, slow, slow_run, ready, start, probed) -> dict:
    import websockets

    latencies: dict[str, list[float]] = {name: [] for name, _, _ in groups}
    stages: dict[str, list[list[float]]] = {name: [] for name, _, _ in groups}
    seen: dict[str, list[tuple[int, int]]] = {name: [] for name, _, _ in groups}
    backfilled = dict.fromkeys(latencies, 0)
    connected, errors = [], []

    def connect(run_id: int, query: str = "", **kwargs):
        return websockets.connect(f"ws://127.0.0.1:{port}/ws/runs/{run_id}/{query}",
                                  origin=f"http://127.0.0.1:{port}",
                                  additional_headers={"Cookie": cookie}, max_size=None,
                                  open_timeout=60, **kwargs)

    async def client(name: str, run_id: int, stop_at: list) -> None:
        try:
            await receive(name, run_id, stop_at)
        except Exception as exc:   # counted: a client the server dropped misses events
            errors.append(f"{name}: {exc!r}")
            seen[name].append((run_id, 0))

    async def receive(name: str, run_id: int, stop_at: list) -> None:
        count = 0
        async with connect(run_id) as ws:
            await ws.send(json.dumps({"last_seq": 0}))
            warm, last = False, time.time()
            # Until the probes stopped and nothing came for QUIET_S (or LATE_S passed):
            # a late delivery is counted late, not missed.
            while not stop_at or (time.time() < stop_at[0] + LATE_S and (
                    time.time() < stop_at[0] or time.time() - last < QUIET_S)):
                try:
                    raw = await asyncio.wait_for(ws.recv(), timeout=1.0)
                except TimeoutError:
                    continue
                now = last = time.time()
                for event in json.loads(raw).get("events", []):
                    if event["seq"] == 1:      # the warm-up (WARM_UP), live or backfilled
                        warm = True
                        connected.append(1)
                    elif warm and "committed_at" in event:
                        latencies[name].append(now - event["committed_at"])
                        stamps = [event.get(k) for k in STAMPS] + [now]
                        if None not in stamps:
                            stages[name].append([b - a for a, b in itertools.pairwise(stamps)])
                        count += 1
                    elif warm:   # refilled from the database after a dropped message
                        backfilled[name] += 1
                        count += 1
        seen[name].append((run_id, count))

    async def slow_client(stop_at: list) -> None:
        # A small queue and no reads: the library stops reading the socket, the kernel's
        # buffers fill, and the server's sends to it block.
        # ?slow: the server's own figures leave its sends out (bench/ingest_asgi.py).
        async with connect(slow_run, "?slow", max_queue=1, ping_interval=None,
                           close_timeout=1) as ws:
            sock = ws.transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            await ws.send(json.dumps({"last_seq": 0}))
            connected.append(1)
            while not stop_at or time.time() < stop_at[0] + QUIET_S:
                await asyncio.sleep(0.5)

    stop_at: list[float] = []
    tasks = [asyncio.create_task(client(name, run_id, stop_at))
             for name, run_ids, per_run in groups for run_id in run_ids
             for _ in range(per_run)]
    tasks += [asyncio.create_task(slow_client(stop_at)) for _ in range(slow)]
    while len(connected) + len(errors) < len(tasks):   # a failed client is reported
        await asyncio.sleep(0.05)
    ready.set()
    await asyncio.to_thread(start.wait)
    await asyncio.to_thread(probed.wait)   # a probe may wait seconds behind the senders
    stop_at.append(time.time())
    await asyncio.gather(*tasks, return_exceptions=True)   # a slow client may be dropped
    return {"latencies": latencies, "stages": stages, "seen": seen, "errors": errors,
            "backfilled": backfilled}
