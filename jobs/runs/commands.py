"""A launched external run: the user's training command as a Ray job.

    submit_run(id) -> submit_once -> command_submission(run, token)
        entrypoint           the command as the user wrote it ("python train.py --lr 1e-6")
        runtime_env          working_dir and pip as given; env_vars: the user's env plus
                             RLPLANE_URL, RLPLANE_RUN_ID, RLPLANE_TOKEN (the run's freshly
                             claimed ingest token) and MLFLOW_TRACKING_URI/_TOKEN, so
                             rlplane.track, an adapter or the MLflow client connects itself
        entrypoint_num_cpus  the launch's CPUs and GPUs, reserved by Ray for the command:
        entrypoint_num_gpus  what the queue counted for it (jobs/runs/queue.py run_demand)

After that the run is followed like any run with a Ray job (jobs/runs/tasks.py): Ray's job
status moves it (a command that exits 0 without reporting a status succeeded; one that
exits non-zero failed, with Ray's message and its last lines), a stop asks the process
first (the controls door's "stop", rlplane.track's stop_requested) and stops the Ray job
after RLPLANE_STOP_TIMEOUT_S, and the job's output reaches the log panel
(jobs/runs/job_logs.py).
"""

from __future__ import annotations

from django.conf import settings

from jobs.models import Run


def command_env(run: Run, token: str) -> dict[str, str]:
    """The command's environment: the user's variables, then what rlplane injects (the
    config refuses user variables of those names, so nothing here is overridden)."""
    base = settings.RLPLANE_URL.rstrip("/")
    return {**run.external_config.launch.env,
            "RLPLANE_URL": base,
            "RLPLANE_RUN_ID": str(run.pk),
            "RLPLANE_TOKEN": token,
            "MLFLOW_TRACKING_URI": f"{base}/mlflow",
            "MLFLOW_TRACKING_TOKEN": token}


def command_submission(run: Run, token: str) -> dict:
    """JobSubmissionClient.submit_job's arguments (less submission_id and metadata) for a
    launched external run."""
    launch = run.external_config.launch
    runtime_env: dict = {"env_vars": command_env(run, token)}
    if launch.working_dir:
        runtime_env["working_dir"] = launch.working_dir
    if launch.pip:
        runtime_env["pip"] = list(launch.pip)
    submission = {"entrypoint": launch.entrypoint, "runtime_env": runtime_env,
                  "entrypoint_num_cpus": launch.cpus}
    if launch.gpus:  # 0 would still be a request; Ray's default leaves GPUs alone
        submission["entrypoint_num_gpus"] = launch.gpus
    return submission
