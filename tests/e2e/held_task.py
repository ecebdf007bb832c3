"""A task that holds its pool process, for tests/e2e/test_worker_survives_redis.py: the
worker loads it beside the control plane's own (celery worker --include)."""

import time

from celery import shared_task


@shared_task(name="tests.e2e.held_task.hold")
def hold(seconds: float) -> None:
    time.sleep(seconds)
