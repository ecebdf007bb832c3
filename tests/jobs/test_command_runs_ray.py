"""A launched external run through the real stack (issue 29 item 6): created like the
API does, admitted by the queue, submitted as a Ray job on the session's shared head,
reporting to pytest-django's live server with the token rlplane put in its environment,
followed by sync_runs as beat does. A stop ends a command that uses rlplane.track by its
own hand (what the TRL callback does), and one that never polls by enforce_stop."""

import json
import sys
import urllib.request

import pytest
from django.contrib.auth.models import User
from ray.job_submission import JobStatus

from jobs.models import MetricPoint, Run, RunEvent, RunStatus
from jobs.queries.run_page import recent_logs
from jobs.runs import submit, tasks
from jobs.runs.actions import do_create_external_run, do_stop_run
from jobs.runs.queue import do_schedule_runs

from .test_tasks import (  # noqa: F401
    TERMINAL_JOB,
    cluster,
    job_log,
    make_stop_overdue,
    unlocked,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# What a training script that reports by hand does: two steps of its own metric names.
REPORT = """\
import json, os, time, urllib.request
url = f"{os.environ['RLPLANE_URL']}/api/runs/{os.environ['RLPLANE_RUN_ID']}/events"
events = [{"type": "metrics.append", "seq": i, "ts": time.time(), "step": i,
           "values": {"my/score": 0.5 * i}} for i in (1, 2)]
request = urllib.request.Request(url, json.dumps({"events": events}).encode(), headers={
    "Authorization": "Bearer " + os.environ["RLPLANE_TOKEN"],
    "Content-Type": "application/json"})
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
print("posted", opener.open(request, timeout=30).read().decode(), flush=True)
print("mlflow at", os.environ["MLFLOW_TRACKING_URI"])
"""


# What an adapter does with rlplane.track: report, then leave when the run page says stop.
POLITE = """\
import time
from rlplane import track

run = track.init(controls_interval=0.2, flush_interval=0.1)
run.log(1, {"my/score": 0.5})
run.log_text("waiting for a stop")
while not run.stop_requested:
    time.sleep(0.1)
run.finish(status="stopped", reason="asked to")
print("stopped by its own hand", flush=True)
"""


@pytest.fixture
def commands(cluster, live_server, settings, monkeypatch):  # noqa: F811
    """The control plane pointed at the head and the live server; the queue's submit_run
    runs at once."""
    settings.RLPLANE_URL = live_server.url
    monkeypatch.setattr(submit.submit_run, "delay", lambda run_id: submit.submit_run(run_id))
    return cluster


def launch(entrypoint: str, **launch) -> Run:
    config = {"name": "cmd", "framework": "script",
              "launch": {"entrypoint": entrypoint, "cpus": 1, **launch}}
    run, _ = do_create_external_run(User.objects.create_user("olga"), config)

    def admitted():  # a head that just started has not reported its CPUs yet: beat retries
        run.refresh_from_db()
        return run.status != RunStatus.QUEUED or unlocked(do_schedule_runs)

    wait_for(admitted, 30, every_s=0.5, what="the queue to admit it")
    run.refresh_from_db()
    assert run.status == RunStatus.SUBMITTING and run.ray_submission_id, run.status_reason
    return run


def launch_script(tmp_path, source: str, **launch_fields) -> Run:
    """A launched run of a Python script uploaded as the job's working_dir."""
    workdir = tmp_path / "train"
    workdir.mkdir()
    (workdir / "train.py").write_text(source)
    return launch(f"{sys.executable} train.py", working_dir=str(workdir), **launch_fields)


def sync_until_the_job_ended(client, run: Run) -> None:
    """sync_runs as beat calls it, until the run's Ray job has ended; then once more."""
    sid = run.ray_submission_id

    def ended():
        unlocked(tasks.sync_runs)
        return client.get_job_status(sid) in TERMINAL_JOB

    wait_for(ended, 60, every_s=0.5, what=f"job {sid} to end")
    unlocked(tasks.sync_runs)
    run.refresh_from_db()


def test_a_command_reports_with_its_token_its_output_is_logged_and_exit_0_succeeds(
        commands, live_server, tmp_path):
    run = launch_script(tmp_path, REPORT)
    sid = run.ray_submission_id

    sync_until_the_job_ended(commands, run)

    assert run.status == RunStatus.SUCCEEDED, (run.status_reason, job_log(commands, sid))
    assert "exited 0" in run.status_reason
    points = MetricPoint.objects.filter(run=run, name="my/score").order_by("step")
    assert [(p.step, p.value) for p in points] == [(1, 0.5), (2, 1.0)]
    assert RunEvent.highest_seq(run) == 2   # the job's lines took no seq of the process
    lines = [line["message"] for line in recent_logs(run) if line["level"] == "job"]
    assert any(line.startswith('posted {"stored": 2') for line in lines), lines
    assert f"mlflow at {live_server.url}/mlflow" in lines


def test_a_command_that_never_polls_is_stopped_with_its_ray_job(commands, live_server,
                                                                 settings, monkeypatch):
    settings.RLPLANE_STOP_TIMEOUT_S = 1
    monkeypatch.setattr(tasks.stop_run, "delay", lambda run_id: tasks.stop_run(run_id))
    run = launch("sleep 600")
    sid = run.ray_submission_id
    wait_for(lambda: commands.get_job_status(sid) == JobStatus.RUNNING, 30, what="RUNNING")
    unlocked(tasks.sync_runs)
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING   # the job runs, though it said nothing

    do_stop_run(User.objects.get(username="olga"), run)

    # The process is asked first, on the door rlplane.track polls, with its own token.
    token = commands.get_job_info(sid).runtime_env["env_vars"]["RLPLANE_TOKEN"]
    request = urllib.request.Request(f"{live_server.url}/api/runs/{run.pk}/controls",
                                     headers={"Authorization": f"Bearer {token}"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    assert json.loads(opener.open(request, timeout=10).read())["stop"] is True

    make_stop_overdue(run)   # `sleep` never listened: the next sync stops its Ray job
    unlocked(tasks.sync_runs)

    run.refresh_from_db()
    assert run.status == RunStatus.STOPPED and "was stopped" in run.status_reason
    wait_for(lambda: commands.get_job_status(sid) == JobStatus.STOPPED, 30, what="STOPPED")


def test_a_command_that_polls_rlplane_track_stops_by_its_own_hand(commands, tmp_path,
                                                                  settings, monkeypatch):
    monkeypatch.setattr(tasks.stop_run, "delay", lambda run_id: tasks.stop_run(run_id))
    # rlplane.track of this checkout, spooling under the test's own folder
    run = launch_script(tmp_path, POLITE, env={"PYTHONPATH": str(settings.BASE_DIR),
                                               "XDG_CACHE_HOME": str(tmp_path / "cache")})
    wait_for(lambda: unlocked(MetricPoint.objects.filter(run=run, name="my/score").exists),
             30, what=f"its first metric; its log:\n{job_log(commands, run.ray_submission_id)}")

    unlocked(do_stop_run, User.objects.get(username="olga"), run)
    sync_until_the_job_ended(commands, run)

    assert run.status == RunStatus.STOPPED, (run.status_reason,
                                             job_log(commands, run.ray_submission_id))
    assert commands.get_job_status(run.ray_submission_id) == JobStatus.SUCCEEDED  # exited
    messages = [(line["level"], line["message"]) for line in recent_logs(run)]
    assert ("info", "waiting for a stop") in messages               # reported by track
    assert ("job", "stopped by its own hand") in messages            # printed
    tasks.enforce_stop(run.pk)   # comes too late: nothing left to stop
    assert Run.objects.get(pk=run.pk).status == RunStatus.STOPPED
