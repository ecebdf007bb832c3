"""A Celery worker SIGKILLed after it claimed a notification (issue 19 item 12): the
notification is delivered exactly once, by a new worker, once the dead one's claim expired.

    test --setsid--> redis-server, celery worker A (solo pool)
    queue deliver_notification(n) -> A claims n, POSTs to the receiver, which holds the
    request unanswered -> SIGKILL A (its task was acked on receipt: Redis will not hand
    it out again) -> celery worker B -> the claim's clock moves past CLAIM_TTL -> the
    beat's redeliver_notifications -> B sends n -> the receiver answers 200, once.

The receiver counts a delivery when it answers it; the request A sent into the void is
never answered, as if A had died just before sending it.
"""

from __future__ import annotations

import threading
import time

import pytest

from controlplane import processes as proc

from ..webhook_receiver import Receiver
from .local_processes import (
    celery_worker_argv,
    drill_env,
    kill_group,
    manage,
    query,
    redis_argv,
    spawn,
    wait_for,
)

SETUP = """
from jobs.alerts.delivery import deliver_notification
from jobs.models import Alert, AlertChannel, Notification, Run
run = Run.objects.create(name="alerted", status="running", config={"name": "alerted"})
alert = Alert.objects.create(run=run, kind="WeightSyncDesync", dedup_key="WeightSyncDesync",
                             cause="the generator is not receiving new weights",
                             runbook="check the sync", step=3, evidence={"values": {}})
channel = AlertChannel.objects.create(name="hook", kind="webhook", target="{url}")
n = Notification.objects.create(alert=alert, channel=channel, event="open")
deliver_notification.delay(n.pk)
print(n.pk)
"""

# What the beat does every 30 s, after the dead worker's claim has aged past CLAIM_TTL.
EXPIRE_AND_SWEEP = """
from jobs.alerts.delivery import redeliver_notifications
from jobs.models import Notification
from jobs.models.alerts import CLAIM_TTL
Notification.objects.filter(status="pending", claimed_at__isnull=False).update(
    claimed_at=Notification.objects.get().claimed_at - CLAIM_TTL)
print(redeliver_notifications())
"""

SWEEP = "from jobs.alerts.delivery import redeliver_notifications; print(redeliver_notifications())"


class HoldingReceiver(Receiver):
    """Holds its first request unanswered until ``release``, then drops it; answers the
    rest with 200 and counts them (``bodies``)."""

    def __init__(self):
        self.first_arrived, self.release = threading.Event(), threading.Event()
        super().__init__()

    def drop(self, request) -> bool:
        if self.first_arrived.is_set():
            return False
        self.first_arrived.set()
        self.release.wait(60)
        return True

    def close(self):
        self.release.set()
        super().close()


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_notification_claimed_by_a_killed_worker_is_delivered_once_by_the_next(tmp_path):
    db, logs = tmp_path / "db.sqlite3", tmp_path / "logs"
    logs.mkdir()
    redis_port = proc.free_port()
    env = drill_env(db, redis_port, RLPLANE_WEBHOOK_ALLOW="127.0.0.1")
    receiver = HoldingReceiver()
    redis = worker_a = worker_b = None
    try:
        redis = spawn(redis_argv(redis_port, tmp_path), env, logs / "redis.log")
        manage(env, "migrate", "--noinput")
        worker_a = spawn(celery_worker_argv("a"), env, logs / "worker-a.log")
        n = int(manage(env, "shell", "-c", SETUP.replace("{url}", receiver.url)).split()[-1])

        wait_for("worker A posting the notification", receiver.first_arrived.is_set, 120,
                 logs / "worker-a.log")
        [(claimed_at, status)] = query(
            db, "SELECT claimed_at, status FROM jobs_notification WHERE id = ?", n)
        assert claimed_at is not None and status == "pending"
        kill_group(worker_a)
        receiver.release.set()

        worker_b = spawn(celery_worker_argv("b"), env, logs / "worker-b.log")
        wait_for("worker B ready", lambda: " ready." in (logs / "worker-b.log").read_text(),
                 120, logs / "worker-b.log")
        swept_at = time.monotonic()
        assert manage(env, "shell", "-c", EXPIRE_AND_SWEEP).split()[-1] == "1"
        wait_for("worker B delivering it", lambda: receiver.bodies, 60,
                 logs / "worker-b.log")
        recovered_s = time.monotonic() - swept_at
        wait_for("the delivery recorded", lambda: query(
            db, "SELECT status FROM jobs_notification WHERE id = ?", n) == [("sent",)], 30)

        assert manage(env, "shell", "-c", SWEEP).split()[-1] == "0"   # nothing left over
        [(attempts, error)] = query(
            db, "SELECT attempts, error FROM jobs_notification WHERE id = ?", n)
        assert (attempts, error) == (1, "")
        assert len(receiver.bodies) == 1
        assert receiver.bodies[0]["kind"] == "WeightSyncDesync"
        print(f"worker killed after its claim: delivered {len(receiver.bodies)} time(s), "
              f"{recovered_s:.1f}s from the sweep to the delivery")
    finally:
        for child in (worker_a, worker_b, redis):
            kill_group(child)
        receiver.close()
