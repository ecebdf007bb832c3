"""The control plane's side of the Ray cluster, shared by the Celery tasks (jobs/runs/tasks.py)
and the cluster page (jobs/cluster/status.py):

    submission_id(id, n)   "rlplane-run-<id>" (RLPLANE_RAY_JOB_PREFIX): a run's Ray job,
                           "rlplane-run-<id>-restart-<n>" its n-th restart (max_restarts);
                           run_id_of() reads either back, None for another control plane's
    ray_auth_headers()     the cluster's bearer token, as Ray looks it up
    ray_jobs()             a JobSubmissionClient with that token
    job_not_found(exc)     the client's "no such job" error, told from the others

Ray itself is imported only inside ``ray_jobs``: the web process never loads it.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings

# RLPLANE_RAY_JOB_PREFIX: one per control plane sharing a Ray cluster
SUBMISSION_PREFIX = settings.RLPLANE_RAY_JOB_PREFIX


def submission_id(run_id: int, attempt: int = 0) -> str:
    """The Ray job of a run's driver: its first, or its ``attempt``-th restart
    (``run.max_restarts``). Derived from the run id and the attempt, so a retried
    submission finds the job it already started instead of starting a second copy."""
    sid = f"{SUBMISSION_PREFIX}{run_id}"
    return f"{sid}{RESTART_SEPARATOR}{attempt}" if attempt else sid


RESTART_SEPARATOR = "-restart-"


def run_id_of(sid: str) -> int | None:
    """The run whose Ray job this is (a restart's too), or None for a job of someone else."""
    rest = sid.removeprefix(SUBMISSION_PREFIX)
    run, _, attempt = rest.partition(RESTART_SEPARATOR)
    if rest == sid or not (run.isascii() and run.isdigit()):
        return None
    if _ and not (attempt.isascii() and attempt.isdigit()):
        return None
    return int(run)


def ray_auth_headers() -> dict[str, str]:
    """The cluster's token as a header, looked up as Ray does it: $RAY_AUTH_TOKEN, else
    the file RAY_AUTH_TOKEN_PATH (default ~/.ray/auth_token). Read per call, so a token
    written after the control plane started is picked up. None found: no header (a
    cluster with RAY_AUTH_MODE=disabled)."""
    token = os.environ.get("RAY_AUTH_TOKEN", "").strip()
    if not token:
        path = Path(settings.RAY_AUTH_TOKEN_PATH)
        token = path.read_text().strip() if path.is_file() else ""
    return {"Authorization": f"Bearer {token}"} if token else {}


def ray_jobs():
    """A JobSubmissionClient for the cluster."""
    from ray.job_submission import JobSubmissionClient

    # Explicit headers, rather than Ray's own token loader: that one reads RAY_AUTH_MODE
    # once per process, and this process (a Celery worker, the web app) is no Ray node.
    return JobSubmissionClient(settings.RAY_DASHBOARD_ADDRESS, headers=ray_auth_headers())


def job_not_found(exc: Exception) -> bool:
    # JobSubmissionClient raises a bare RuntimeError with the HTTP status in its text.
    return isinstance(exc, RuntimeError) and "does not exist" in str(exc)
