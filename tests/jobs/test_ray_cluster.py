import os
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.cluster.ray import job_not_found, ray_auth_headers, run_id_of, submission_id

REPO = Path(__file__).resolve().parents[2]


def test_a_runs_submission_id_reads_back_as_its_run_id():
    assert submission_id(42) == "rlplane-run-42"
    assert run_id_of(submission_id(42)) == 42
    assert submission_id(42, 2) == "rlplane-run-42-restart-2"     # its driver's 2nd restart
    assert run_id_of(submission_id(42, 2)) == 42


@pytest.mark.parametrize("sid", ["someone-else", "rlplane-run-", "rlplane-run-4x", "42",
                                 "rlplane-run-4-restart-x", "rlplane-run--restart-1"])
def test_a_job_of_someone_else_belongs_to_no_run(sid):
    assert run_id_of(sid) is None


def test_the_token_comes_from_the_environment_before_the_file(settings, monkeypatch, tmp_path):
    token_file = tmp_path / "auth_token"
    token_file.write_text("from-file\n")
    settings.RAY_AUTH_TOKEN_PATH = str(token_file)

    monkeypatch.setenv("RAY_AUTH_TOKEN", "from-env")
    assert ray_auth_headers() == {"Authorization": "Bearer from-env"}
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    assert ray_auth_headers() == {"Authorization": "Bearer from-file"}
    token_file.unlink()
    assert ray_auth_headers() == {}


def test_only_the_clients_no_such_job_error_counts_as_not_found():
    assert job_not_found(RuntimeError("Job rlplane-run-1 does not exist"))
    assert not job_not_found(RuntimeError("connection refused"))
    assert not job_not_found(ValueError("does not exist"))


def test_a_job_prefix_ending_in_a_digit_is_refused_naming_the_variable():
    """"run-1" would read job "run-12" back as run 2 of this control plane, where it is
    run 12 of another's (RLPLANE_RAY_JOB_PREFIX, one per control plane on a cluster)."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run([sys.executable, "manage.py", "check"], cwd=REPO, text=True,
                          capture_output=True, timeout=120,
                          env={**env, "RLPLANE_RAY_JOB_PREFIX": "run-1"})
    assert done.returncode != 0
    assert "RLPLANE_RAY_JOB_PREFIX='run-1'" in done.stderr and "non-digit" in done.stderr
