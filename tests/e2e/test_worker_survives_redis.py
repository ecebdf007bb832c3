"""A Redis SIGKILLed while tasks wait for the Celery worker's busy pool: the worker (the
stack's own command and settings) reconnects to the Redis started again, it does not exit.

    test --setsid--> redis-server, celery worker (controlplane.stack.service_argv,
                     --include tests.e2e.held_task: a task that holds a pool process)
    6 held tasks for 2 pool processes -> SIGKILL Redis -> Redis again on its port ->
    the worker says "Connected to" it again, and is alive

A message the worker fetched ahead and holds unacknowledged makes kombu's restore of it
raise when the connection drops, and the worker exit ("Unrecoverable error:
AttributeError", kombu 5.7): settings.CELERY_WORKER_DISABLE_PREFETCH keeps every message
in Redis until a pool process is free. Without it the worker gave up here at once
(it exits once its held tasks end).
"""

from __future__ import annotations

import sys

import pytest
import redis as redis_client
from celery import Celery

from controlplane import processes as proc
from controlplane.stack import service_argv

from .local_processes import drill_env, kill_group, redis_argv, spawn, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

HELD = 6    # tasks that each hold a pool process for a minute; the worker has 2


def test_a_redis_killed_while_tasks_wait_for_the_pool_leaves_the_worker_running(tmp_path):
    port = proc.free_port()
    env = drill_env(tmp_path / "db.sqlite3", port)
    redis_log, worker_log = tmp_path / "redis.log", tmp_path / "worker.log"
    redis = spawn(redis_argv(port, tmp_path), env, redis_log)
    worker = None
    try:
        argv = service_argv(sys.executable, "127.0.0.1", str(port), "unused")["celery-worker"]
        worker = spawn([*argv, "--include=tests.e2e.held_task"], env, worker_log)

        def logged(line: str) -> int:
            return worker_log.read_text(errors="replace").count(line)

        wait_for("the worker ready", lambda: logged(" ready.") == 1, 60, worker_log)
        client = Celery(broker=env["REDIS_URL"])
        for _ in range(HELD):
            client.send_task("tests.e2e.held_task.hold", (60,))
        queue = redis_client.Redis(port=port)
        # Each message either taken by the worker or still waiting in Redis's queue
        # ("celery"): both pool processes busy, and what the worker would fetch ahead, if
        # it did, fetched.
        wait_for("both pool processes held and the rest settled", lambda: logged(
            "Task tests.e2e.held_task.hold[") >= 2 and logged(
            "Task tests.e2e.held_task.hold[") + queue.llen("celery") == HELD, 30, worker_log)
        connected = logged("Connected to redis://")

        kill_group(redis)   # and kept down until the worker saw it go
        wait_for("the worker saw Redis go", lambda: worker.poll() is not None or logged(
            "Connection to broker lost") > 0, 30, worker_log)
        redis = spawn(redis_argv(port, tmp_path), env, redis_log)

        # A worker that gave up says so at once, and exits once its held tasks end.
        wait_for("the worker reconnected, or gave up", lambda: worker.poll() is not None
                 or logged("Unrecoverable error") or logged("Connected to redis://")
                 > connected, 60, worker_log)
        assert worker.poll() is None and not logged("Unrecoverable error"), (
            f"the worker gave up:\n{proc.log_tail(worker_log, 80)}")
    finally:
        kill_group(worker)
        kill_group(redis)
