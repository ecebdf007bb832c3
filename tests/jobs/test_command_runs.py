"""A launched external run (issue 29 item 6) without Ray: what submit_run hands Ray's Jobs
client for the command, how its job's status moves the run, and how the job's output is
stored beside what the process reports (seqs below 0). Against a real Ray head:
test_command_runs_ray.py."""

from types import SimpleNamespace

import pytest
from django.contrib.auth.models import User
from ray.job_submission import JobStatus

from engine.api import LogEvent
from jobs.models import Run, RunEvent, RunStatus
from jobs.queries.run_page import recent_logs
from jobs.runs import job_logs, submit, tasks
from jobs.runs.actions import do_create_external_run
from jobs.runs.queue import run_demand

pytestmark = pytest.mark.django_db

LAUNCHED = {"name": "trl-cmd", "framework": "trl", "params": {"max_steps": 3},
            "launch": {"entrypoint": "python train.py --lr 1e-6", "working_dir": "/srv/trl",
                       "env": {"HF_HOME": "/cache/hf"}, "pip": ["trl==0.19.1"],
                       "gpus": 2, "cpus": 4}}


class RecordingJobs:
    """Ray's Jobs client at its seam: no job exists yet; submissions are recorded."""

    def __init__(self):
        self.submitted: list[dict] = []

    def get_job_info(self, sid):
        raise RuntimeError(f"Job {sid} does not exist")

    def submit_job(self, **kwargs):
        self.submitted.append(kwargs)


@pytest.fixture
def launched(queued) -> Run:
    run, token = do_create_external_run(User.objects.create_user("olga"), LAUNCHED)
    assert token is None and run.status == RunStatus.QUEUED
    return run


def test_a_launched_command_is_submitted_with_its_token_mlflow_and_resources(launched,
                                                                            settings):
    settings.RLPLANE_URL = "http://cp.example:8000/"
    jobs = RecordingJobs()
    launched.transition_to(RunStatus.SUBMITTING)

    submit.submit_once(launched, jobs)

    (job,) = jobs.submitted
    env = job["runtime_env"]["env_vars"]
    launched.refresh_from_db()
    assert job["entrypoint"] == "python train.py --lr 1e-6"
    assert (job["entrypoint_num_cpus"], job["entrypoint_num_gpus"]) == (4, 2)
    assert run_demand(launched) == {"CPU": 4.0, "GPU": 2.0}   # what the queue counted
    assert job["runtime_env"]["working_dir"] == "/srv/trl"
    assert job["runtime_env"]["pip"] == ["trl==0.19.1"]
    assert job["submission_id"] == launched.ray_submission_id
    assert env["HF_HOME"] == "/cache/hf"
    assert env["RLPLANE_URL"] == "http://cp.example:8000"
    assert env["RLPLANE_RUN_ID"] == str(launched.pk)
    assert env["MLFLOW_TRACKING_URI"] == "http://cp.example:8000/mlflow"
    assert env["MLFLOW_TRACKING_TOKEN"] == env["RLPLANE_TOKEN"]
    assert launched.has_ingest_token(env["RLPLANE_TOKEN"])
    assert job["metadata"]["rlplane_framework"] == "trl"


def test_a_command_without_gpus_reserves_none_and_leaves_the_runtime_env_bare(queued):
    config = {"name": "script", "framework": "script",
              "launch": {"entrypoint": "python -c 'print(1)'", "cpus": 0.5}}
    run, _ = do_create_external_run(User.objects.create_user("olga"), config)
    jobs = RecordingJobs()

    submit.submit_once(run, jobs)

    (job,) = jobs.submitted
    assert job["entrypoint_num_cpus"] == 0.5 and "entrypoint_num_gpus" not in job
    assert set(job["runtime_env"]) == {"env_vars"}


FAILED_MESSAGE = ("Job entrypoint command failed with exit code 1, last available logs "
                  "(truncated to 20,000 chars):\nValueError: no dataset at ./data")


class JobStatuses:
    """get_job_info answering a fixed status per submission id, as Ray words it."""

    def __init__(self, **statuses):
        self.statuses = statuses

    def get_job_info(self, sid):
        status = self.statuses[sid]
        failed = status == JobStatus.FAILED
        return SimpleNamespace(status=status, message=FAILED_MESSAGE if failed else "",
                               driver_exit_code=1 if failed else None)


@pytest.mark.parametrize("job, stop_requested, expected", [
    (JobStatus.RUNNING, False, RunStatus.RUNNING),
    (JobStatus.SUCCEEDED, False, RunStatus.SUCCEEDED),   # exited 0, never said a status
    (JobStatus.SUCCEEDED, True, RunStatus.STOPPED),      # polled the stop flag and left
    (JobStatus.FAILED, False, RunStatus.FAILED),
])
def test_a_commands_job_status_is_its_runs(launched, monkeypatch, job, stop_requested,
                                           expected):
    Run.objects.filter(pk=launched.pk).update(status=RunStatus.SUBMITTING,
                                              ray_submission_id="rlplane-run-x")
    if stop_requested:
        launched.refresh_from_db()
        launched.request_stop("asked")
    monkeypatch.setattr(tasks, "ray_jobs", lambda: JobStatuses(**{"rlplane-run-x": job}))

    tasks.follow_ray_jobs()

    launched.refresh_from_db()
    assert launched.status == expected
    if expected == RunStatus.FAILED:  # why, in the command's own last lines
        assert "exit code 1" in launched.status_reason
        assert "no dataset at ./data" in launched.status_reason


def test_a_native_run_waits_for_the_engines_own_running(make_run, monkeypatch):
    run = make_run(RunStatus.SUBMITTING, ray_submission_id="rlplane-run-n")
    monkeypatch.setattr(tasks, "ray_jobs",
                        lambda: JobStatuses(**{"rlplane-run-n": JobStatus.RUNNING}))
    tasks.follow_ray_jobs()
    assert Run.objects.get(pk=run.pk).status == RunStatus.SUBMITTING


def job_seqs(run):
    return list(RunEvent.objects.filter(run=run, seq__lt=0).order_by("-seq")
                .values_list("seq", flat=True))


def test_job_output_is_stored_line_by_line_below_seq_0_once(launched):
    first = job_logs.do_store_job_log(launched, "loading\nstep 1\nstep 2 par", False)
    again = job_logs.do_store_job_log(launched, "loading\nstep 1\nstep 2 par", False)
    last = job_logs.do_store_job_log(launched, "loading\nstep 1\nstep 2 partly\n\nbar 1%\rbar 100%",
                                     True)

    assert [p["message"] for p in first] == ["loading", "step 1"] and again == []
    assert [p["message"] for p in last] == ["step 2 partly", "bar 100%"]
    assert job_seqs(launched) == [-1, -2, -3, -5]  # the blank line 4 is not stored
    assert {p["level"] for p in first + last} == {job_logs.JOB_LOG_LEVEL}
    assert RunEvent.highest_seq(launched) == 0     # the process's stream has nothing yet


def test_a_burst_keeps_the_newest_lines_and_says_how_many_were_not_shown(launched,
                                                                        monkeypatch):
    monkeypatch.setattr(job_logs, "JOB_LOG_LINES_PER_SYNC", 3)
    monkeypatch.setattr(job_logs, "JOB_LOG_KEEP", 4)
    monkeypatch.setattr(job_logs, "JOB_LOG_LINE_CHARS", 7)
    text = "".join(f"line {k}\n" for k in range(1, 10)) + "line 10 is long\n"

    stored = job_logs.do_store_job_log(launched, text, False)
    job_logs.do_store_job_log(launched, text + "line 11\n", False)

    assert [p["message"] for p in stored] == [
        f"... 7 lines not shown (all of them: ray job logs {launched.ray_submission_id})",
        "line 8", "line 9", "line 10 [8 characters cut]"]
    assert job_seqs(launched) == [-8, -9, -10, -11]   # the newest JOB_LOG_KEEP lines
    assert job_logs.lines_read(launched) == 11


def test_the_log_panel_merges_the_processs_lines_and_the_jobs_by_time(launched):
    RunEvent.objects.create(run=launched, seq=1, type="log", ts=2.0,
                            payload=LogEvent(seq=1, ts=2.0, message="reported").to_dict())
    rows = [job_logs.log_row(launched, 1, 1.0, "printed first"),
            job_logs.log_row(launched, 2, 3.0, "printed last")]
    RunEvent.objects.bulk_create(rows)

    assert [line["message"] for line in recent_logs(launched)] == [
        "printed first", "reported", "printed last"]


class LogsOf:
    """get_job_status/get_job_logs at the seam: a log per submission id, or the error
    Ray's client raises for it."""

    def __init__(self, **logs):
        self.logs = logs

    def get_job_status(self, sid):
        return JobStatus.RUNNING

    def get_job_logs(self, sid):
        if isinstance(self.logs[sid], Exception):
            raise self.logs[sid]
        return self.logs[sid]


def test_a_log_ray_cannot_give_now_does_not_hold_up_the_others(launched, monkeypatch):
    other, _ = do_create_external_run(User.objects.get(username="olga"), LAUNCHED)
    Run.objects.filter(pk=launched.pk).update(status=RunStatus.RUNNING, ray_submission_id="a")
    Run.objects.filter(pk=other.pk).update(status=RunStatus.RUNNING, ray_submission_id="b")
    monkeypatch.setattr(job_logs, "ray_jobs", lambda: LogsOf(
        a=RuntimeError("Request failed with status code 500: node away"), b="epoch 1\n"))

    job_logs.follow_job_logs()

    assert job_seqs(launched) == [] and job_seqs(other) == [-1]
