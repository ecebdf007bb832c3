import pytest

from jobs.cluster.ray import job_not_found, ray_auth_headers, run_id_of, submission_id


def test_a_runs_submission_id_reads_back_as_its_run_id():
    assert submission_id(42) == "rlplane-run-42"
    assert run_id_of(submission_id(42)) == 42


@pytest.mark.parametrize("sid", ["someone-else", "rlplane-run-", "rlplane-run-4x", "42"])
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
