"""Submitting a run: its driver as a Ray job, once.

    submit_run(id)    queued -> submitting; mint the ingest token; submit
                      `python -m engine.ray_job ...` as Ray job "rlplane-run-<id>"
                      (the engine's own "running" event moves the run on, through ingest);
                      a launched external run's command instead (jobs/runs/commands.py)

Before a driver is submitted, its run directory gets a marker with the run's key
(engine.run_dir); the driver refuses to start where it cannot read that key back, which
is what a Ray node without the shared mount at RLPLANE_RUNS_DIR sees (deploy/README.md).
RLPLANE_DRIVER_RESOURCES (custom Ray resources) decides which nodes may hold a driver.

The submission id is derived from the run id (jobs/cluster/ray.py), so a retried
submit_run finds the job it already started instead of starting a second copy. The queue
(jobs/runs/queue.py) queues submit_run for each run it admits.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys

from celery import shared_task
from django.conf import settings

from engine.api import mark_run_dir
from jobs.cluster.ray import job_not_found, ray_jobs, submission_id
from jobs.models import Run, RunStatus
from jobs.models.run import run_directory
from jobs.runs.commands import command_submission

logger = logging.getLogger(__name__)

TOKEN_ENV = "RLPLANE_INGEST_TOKEN"


def driver_entrypoint(run: Run) -> str:
    """The shell command of the Ray job: this checkout, this Python, the engine's Ray job entry."""
    base = settings.RLPLANE_URL.rstrip("/")
    run_dir = run_directory(run.pk)
    args = [
        sys.executable, "-m", "engine.ray_job",
        "--config-json", json.dumps(run.config, separators=(",", ":")),
        "--run-dir", str(run_dir),
        "--ingest-url", f"{base}/api/runs/{run.pk}/events",
        "--controls-url", f"{base}/api/runs/{run.pk}/controls",
        "--token-env", TOKEN_ENV,
        # A job that Ray restarts for the same run continues from its own checkpoints.
        "--resume",
        "--run-dir-key", run_dir_key(run),
    ]
    if run.source_checkpoint:
        args += ["--from-checkpoint", run.source_checkpoint]
    return f"cd {shlex.quote(str(settings.BASE_DIR))} && exec {shlex.join(args)}"


def ray_submission(run: Run, token: str) -> dict:
    """submit_job's arguments for the run, less its submission id and metadata: the
    engine's driver, or a launched external run's command."""
    if run.is_external:
        return command_submission(run, token)
    submission = {"entrypoint": driver_entrypoint(run),
                  "runtime_env": {"env_vars": driver_env(token)}}
    if settings.RLPLANE_DRIVER_RESOURCES:
        submission["entrypoint_resources"] = dict(settings.RLPLANE_DRIVER_RESOURCES)
    return submission


def run_dir_key(run: Run) -> str:
    """What the run's directory marker holds: its id and creation time, the same for
    every submission of the run, another for a run of the same id in another database."""
    return f"run {run.pk} created {run.created_at.isoformat()}"


def driver_env(token: str) -> dict[str, str]:
    env = {TOKEN_ENV: token}
    if "RLPLANE_CACHE" in os.environ:  # the same model cache as the control plane
        env["RLPLANE_CACHE"] = os.environ["RLPLANE_CACHE"]
    return env


@shared_task(bind=True, max_retries=3)
def submit_run(self, run_id: int) -> None:
    run = Run.objects.get(pk=run_id)
    if run.status == RunStatus.QUEUED:
        run.transition_to(RunStatus.SUBMITTING)
    elif run.status != RunStatus.SUBMITTING:
        logger.info("submit_run: run %s is %s; nothing to submit", run.pk, run.status)
        return
    sid = submission_id(run.pk)
    try:
        submit_once(run, ray_jobs())
    except Exception as exc:
        if self.request.called_directly or self.request.retries >= self.max_retries:
            run.transition_to(RunStatus.FAILED, f"could not submit the Ray job {sid}: {exc}")
            return
        raise self.retry(exc=exc, countdown=2 ** self.request.retries) from exc


def submit_once(run: Run, client) -> None:
    """Submit the run's driver unless its job exists, and record the job."""
    sid = submission_id(run.pk)
    if ensure_job(run, client, sid):
        # Recorded only once Ray has the job: sync_runs takes a recorded id that Ray does
        # not know for a lost job.
        Run.objects.filter(pk=run.pk).update(ray_submission_id=sid)


def ensure_job(run: Run, client, sid: str) -> bool:
    """Submit the run's driver as Ray job ``sid`` unless that job exists; False when a
    racing twin is the one submitting it. A job that exists (a retry after a crash, a lost
    acknowledgement, a racing twin) holds the token minted back then: minting another
    would lock that driver out of ingest."""
    try:
        client.get_job_info(sid)
        return True
    except RuntimeError as exc:
        if not job_not_found(exc):
            raise
    if not run.is_external:
        # Before the token: a runs dir that cannot be written fails the submission with
        # nothing claimed, and a retry starts over.
        mark_run_dir(run_directory(run.pk), run_dir_key(run))
    token = run.claim_ingest_token()
    if token is None:            # a twin read the same state and minted first: it submits
        logger.info("submit_run: a racing twin is submitting run %s", run.pk)
        return False
    try:
        client.submit_job(
            **ray_submission(run, token), submission_id=sid,
            metadata={"rlplane_run_id": str(run.pk), "rlplane_run_name": run.name,
                      "rlplane_framework": run.framework},
        )
    except RuntimeError as exc:
        if "already exists" not in str(exc):
            raise
        # A twin that claimed before this one reached Ray first and its driver holds the
        # token this claim replaced: put that one back.
        run.release_ingest_token()
    return True
