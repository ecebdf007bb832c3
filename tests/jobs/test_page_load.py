"""Page load with a 10,000-step run in the database: what the run page, the compare page
and its JSON send is bounded by their thinning (every chart at most charts.RUN_POINTS /
COMPARE_POINTS steps), not by the run's length. Timed server-side (the test client:
query, chart building, template) and printed with the sizes; times are printed, never
asserted (a loaded CI box is not a regression)."""

import json
import math
import time

import pytest
from django.db import connection

from jobs.models import MetricPoint, Run, RunEvent, RunStatus

STEPS = 10_000
EVAL_EVERY = 10
MAX_BYTES = 2_500_000  # a 10,000-step run's page sent 5.8 MB before the envelope
PER_STEP = (
    "reward/mean", "reward/std", "response_length/p50", "response_length/p99",
    "time/step_s", "time/rollout_s", "time/reward_s", "time/learner_s", "time/weight_sync_s",
    "time/idle_s", "rollout_share", "bubble", "throughput/tokens_per_s",
    "throughput/samples_per_s", "staleness/mean", "staleness/max", "logprob_gap/mean",
    "logprob_gap/max", "learner/loss", "learner/grad_norm", "learner/kl_ref",
    "learner/entropy", "weight_sync/latency_s", "weight_sync/version_learner",
    "weight_sync/version_rollout", "device/cpu_util/cpu:0", "device/memory_gb/cpu:0",
)


def long_run(name: str, parent: Run | None = None) -> Run:
    """A finished run with every canonical metric at each of 10,000 steps (eval/* every
    10th) and the metrics events that say when each step was reported. Rows go in with
    executemany: half a million model instances would take minutes to build."""
    run = Run.objects.create(name=name, config={"name": name, "steps": STEPS}, parent=parent)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    points, events = [], []
    for step in range(1, STEPS + 1):
        value = 0.5 + 0.4 * math.sin(step / 500)
        names = PER_STEP + (("eval/reward_mean",) if step % EVAL_EVERY == 0 else ())
        points += [(run.pk, step, n, value) for n in names]
        ts = 1e9 + 2.0 * step
        events.append((run.pk, step, "metrics.append", ts, json.dumps(
            {"type": "metrics.append", "seq": step, "ts": ts, "step": step, "values": {}})))
    with connection.cursor() as cursor:
        cursor.executemany(f"INSERT INTO {MetricPoint._meta.db_table} (run_id, step, name, "
                           "value) VALUES (%s, %s, %s, %s)", points)
        cursor.executemany(f"INSERT INTO {RunEvent._meta.db_table} (run_id, seq, type, ts, "
                           "payload) VALUES (%s, %s, %s, %s, %s)", events)
    return run


def timed_get(client, url: str) -> tuple[float, int]:
    start = time.perf_counter()
    response = client.get(url)
    elapsed = time.perf_counter() - start
    assert response.status_code == 200, url
    return elapsed, len(response.content)


@pytest.mark.slow
@pytest.mark.postgres
def test_the_run_and_compare_pages_of_a_10000_step_run_send_a_bounded_payload(
        client, admin_user):
    client.force_login(admin_user)
    start = time.perf_counter()
    parent = long_run("long-parent")
    fork = long_run("long-fork", parent=parent)
    setup_s = time.perf_counter() - start

    run_s, run_bytes = timed_get(client, f"/runs/{fork.pk}")
    compare_s, compare_bytes = timed_get(client, f"/runs/compare?ids={parent.pk},{fork.pk}"
                                                 "&level=0.8")
    api_s, api_bytes = timed_get(client, f"/api/runs/compare?ids={parent.pk},{fork.pk}")
    list_s, list_bytes = timed_get(client, "/")

    print(f"\n10,000-step runs ({len(PER_STEP)} metrics/step, fixture {setup_s:.1f} s): "
          f"run page {run_s:.2f} s ({run_bytes / 1e6:.1f} MB), compare page (2 runs) "
          f"{compare_s:.2f} s ({compare_bytes / 1e6:.1f} MB), compare JSON {api_s:.2f} s "
          f"({api_bytes / 1e6:.1f} MB), runs list {list_s:.2f} s")
    assert max(run_bytes, compare_bytes, api_bytes, list_bytes) < MAX_BYTES
