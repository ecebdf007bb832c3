"""What many tests only read, built once per test session and handed to each of them:

    RAY_HEAD       a local Ray head (tests/ray_head.py): 2 CPUs, 2 logical GPUs, token auth
    LOCAL_RAY      Ray started in the test process (fixture ray_gpus, tests/engine): 2 CPUs,
                   4 logical GPUs, for the in-process runs, actors and reward pools
    BROWSER_STACK  the embedded control-plane stack the browser tests drive
                   (tests/stack_helpers.py): an operator account, 2 logical GPUs on its Ray

Each is built by the first test that asks for it (fixtures shared_ray_head and
shared_stack, tests/conftest.py) and stopped right after the last test of this session's
order that uses it (pytest_runtest_teardown there), or at the session's end. A test that
must own its process (a chaos drill, a killed server) starts its own instead. Under
pytest-xdist each worker that runs a user builds its own.

A test leaves the shared thing as it found it (its jobs ended, its runs stopped); the
fixture checks, and a thing left otherwise is stopped and built anew for the next test.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack, closing, contextmanager
from pathlib import Path
from typing import Any

import pytest

REGISTRY: list[Shared] = []
OPERATOR_PASSWORD = "e2e-operator-password"


class Shared:
    """One shared thing: ``build()`` is a context manager that starts it and stops it."""

    def __init__(self, fixture: str, build: Callable[[], AbstractContextManager],
                 group: bool = False):
        self.fixture = fixture     # the fixture that hands it out: its users ask for this
        self.build = build
        self.group = group         # run its users back to back (tests/conftest.py)
        self.value: Any = None
        self.error: BaseException | None = None
        self.last_user = None      # the item after whose teardown it stops
        self._exit: ExitStack | None = None
        REGISTRY.append(self)

    def get(self) -> Any:
        if self.error is not None:     # as a module fixture that failed: once per session
            raise RuntimeError(f"{self.fixture} failed to start earlier in this "
                               f"session") from self.error
        if self._exit is None:
            exit_stack = ExitStack()
            try:
                self.value = exit_stack.enter_context(self.build())
            except (Exception, pytest.fail.Exception) as exc:
                self.error = exc
                raise
            self._exit = exit_stack
        return self.value

    def stop(self) -> None:
        exit_stack, self._exit, self.value = self._exit, None, None
        if exit_stack is not None:
            exit_stack.close()


def users(thing: Shared, items: list) -> list:
    return [item for item in items if thing.fixture in item.fixturenames]


def group_users(items: list) -> None:
    """Move the users of each grouped thing to run right after the first of them, so it
    is up for one stretch: not idle beside the tests between them (chaos drills that
    start their own control plane, serial tests that judge timing). For things only
    tests without the database use: pytest-django orders database tests by kind."""
    for thing in REGISTRY:
        if not thing.group:
            continue
        using = users(thing, items)
        if not using:
            continue
        first = items.index(using[0])
        rest = [item for item in items if thing.fixture not in item.fixturenames]
        items[:] = rest[:first] + using + rest[first:]


def note_last_users(items: list) -> None:
    for thing in REGISTRY:
        using = users(thing, items)
        thing.last_user = using[-1] if using else None


# --- the shared things ---------------------------------------------------------------------

@contextmanager
def ray_head():
    from .ray_head import RayHead

    # The superset of what its users declared: the queue's and the cluster page's tests
    # weigh placements against 2 logical GPUs; the task tests ask for none.
    head = RayHead(num_gpus=2)
    head.wait_ready()     # stops the head itself when it fails
    try:
        yield head
    finally:
        head.stop()


RAY_HEAD = Shared("shared_ray_head", ray_head)


def ray_submission_prefix() -> str:
    """A prefix of a test's own for its runs' Ray jobs (jobs.cluster.ray.submission_id):
    run ids start again with each test's database and Ray keeps an ended job's id taken, so
    two tests' "rlplane-run-1" would collide on one head."""
    return f"rlplane-{uuid.uuid4().hex[:8]}-run-"


def end_jobs(head, timeout_s: float = 30) -> bool:
    """Stop the jobs a test left running on the head and wait for them to end; False when
    they did not (the head is then built anew for the next test)."""
    from ray.job_submission import JobStatus

    ended = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}
    client = head.client()
    running = [job.submission_id for job in client.list_jobs() if job.status not in ended]
    for sid in running:
        client.stop_job(sid)
    deadline = time.monotonic() + timeout_s
    while running and time.monotonic() < deadline:
        running = [sid for sid in running if client.get_job_status(sid) not in ended]
        time.sleep(0.3)
    return not running


def browser_stack():
    from .stack_helpers import running_stack

    # Two logical GPUs on the Ray head: room for a disaggregated placement's two bundles.
    return running_stack("rle2e", RLPLANE_ADMIN_USER="operator",
                         RLPLANE_ADMIN_PASSWORD=OPERATOR_PASSWORD, RLPLANE_LOGICAL_GPUS="2")


BROWSER_STACK = Shared("shared_stack", browser_stack, group=True)


@contextmanager
def local_ray():
    import ray

    ray.init(address="local", num_cpus=2, num_gpus=4, include_dashboard=False,
             log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


# One per test process, not one per module: ten modules each started and stopped their
# own (5-9 s a start on 2 cores).
LOCAL_RAY = Shared("ray_gpus", local_ray)


def ray_released(ray, timeout_s: float = 10.0) -> bool:
    """Whether every CPU and GPU of the local instance is free again (a module's actors
    killed, its placement groups removed); False when not within ``timeout_s``."""
    total = ray.cluster_resources()
    deadline = time.monotonic() + timeout_s
    while True:
        free = ray.available_resources()
        if all(free.get(k, 0.0) == total.get(k, 0.0) for k in ("CPU", "GPU")):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def unfinished_runs(state: Path) -> int:
    """Runs of the stack that are not final: a test stops the runs it launched."""
    with closing(sqlite3.connect(f"file:{state / 'db.sqlite3'}?mode=ro", uri=True)) as db:
        return db.execute("SELECT count(*) FROM jobs_run WHERE status IN "
                          "('queued', 'submitting', 'running', 'stopping')").fetchone()[0]
