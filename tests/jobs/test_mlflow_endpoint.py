"""The MLflow endpoint (issue 29) driven by the real mlflow client against a live server:
what a veRL/TRL/NeMo-RL user sets is MLFLOW_TRACKING_URI and MLFLOW_TRACKING_TOKEN."""

import gc
import math

import pytest

from engine.api import metrics as M
from jobs.mlflow.actions import merged_config, param_value
from jobs.models import MetricPoint, Run, RunEvent, RunStatus
from jobs.runs.actions import do_create_external_run

from .helpers import api_token


@pytest.fixture
def mlflow(live_server, monkeypatch):
    """The real client (imported here: its import takes seconds, paid only where used)
    pointed at the live server, failing at once instead of retrying for minutes."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    for name in ("MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_EXPERIMENT_ID"):
        monkeypatch.delenv(name, raising=False)
    import mlflow

    mlflow.set_tracking_uri(live_server.url + "/mlflow")
    yield mlflow
    while mlflow.active_run():
        mlflow.end_run()
    mlflow.set_tracking_uri(None)
    # The client's kept-alive connections closed: each holds a live-server thread, and that
    # thread its database connection, so PostgreSQL could not drop the test database at
    # the end ("being accessed by other users"). Its sessions are cached; dropped from the
    # cache, collected, their sockets close.
    from mlflow.utils.request_utils import _cached_get_request_session

    _cached_get_request_session.cache_clear()
    gc.collect()


@pytest.fixture
def use_token(monkeypatch):
    """Sets the token the client sends, as a user sets MLFLOW_TRACKING_TOKEN."""
    return lambda token: monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", token)


def external_run(framework="verl"):
    """A run whose process reports by itself: (run, its ingest token)."""
    return do_create_external_run(None, {"name": "grpo", "framework": framework})


def points(run):
    return {(p.name, p.step): p.value for p in MetricPoint.objects.filter(run=run)}


def test_a_run_token_logs_params_metric_batches_and_the_end_status_into_its_run(mlflow, use_token):
    run, token = external_run()
    use_token(token)

    mlflow.set_experiment("verl-gsm8k")
    with mlflow.start_run(run_name="qwen-0.5b") as active:
        assert active.info.run_id == str(run.pk)
        mlflow.log_params({"trainer.total_training_steps": 3, "actor.lr": 1e-6,
                           "model": "Qwen/Qwen2.5-0.5B"})
        for step in (1, 2, 3):  # transformers' MLflowCallback logs asynchronously
            mlflow.log_metrics({"critic/score/mean": step / 10, "timing_s/gen": 1.5},
                               step=step, synchronous=step != 2)
        mlflow.log_metric("actor/pg_loss", math.nan, step=3)
        mlflow.set_tags({"team": "rl"})
        mlflow.log_dict({"input": "1+1"}, "val_step3.json")  # dropped, noted in the log

    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED
    stored = points(run)
    assert {step for _, step in stored} == {1, 2, 3}
    # veRL's names are stored as rlplane's; NaN as null, as ingest does
    assert stored[M.REWARD_MEAN, 2] == 0.2 and stored[M.TIME_ROLLOUT_S, 3] == 1.5
    assert stored[M.LEARNER_LOSS, 3] is None
    notes = RunEvent.objects.filter(run=run, type="log").values_list("payload", flat=True)
    assert ["val_step3.json" in note["message"] for note in notes] == [True]
    params = run.external_config.params
    assert params["trainer.total_training_steps"] == 3 and params["actor.lr"] == 1e-6
    assert params["model"] == "Qwen/Qwen2.5-0.5B"
    assert params["mlflow"]["experiment_id"] == "verl-gsm8k"
    assert params["mlflow"]["tags"]["team"] == "rl"
    fetched = mlflow.MlflowClient().get_run(str(run.pk))
    assert fetched.info.status == "FINISHED" and fetched.data.params["model"] == "Qwen/Qwen2.5-0.5B"


def test_a_wrong_token_is_refused(mlflow, use_token):
    use_token("not-a-token")
    with pytest.raises(mlflow.exceptions.MlflowException) as refused:
        mlflow.MlflowClient().create_run("0")
    assert refused.value.error_code == "UNAUTHENTICATED"
    assert refused.value.get_http_status_code() == 401


def test_a_run_token_cannot_touch_another_run(mlflow, use_token):
    mine, token = external_run()
    theirs, _ = external_run()
    use_token(token)
    client = mlflow.MlflowClient()
    for touch in (lambda: client.log_metric(str(theirs.pk), "reward", 1.0, step=1),
                  lambda: client.get_run(str(theirs.pk)),
                  lambda: client.set_terminated(str(theirs.pk), "FAILED")):
        with pytest.raises(mlflow.exceptions.MlflowException) as refused:
            touch()
        assert refused.value.error_code == "PERMISSION_DENIED"
    theirs.refresh_from_db()
    assert theirs.status == RunStatus.RUNNING and not points(theirs)


def test_an_operator_token_creates_an_external_run_and_a_viewer_token_only_reads(mlflow, use_token):
    someone_elses, _ = external_run()
    use_token(api_token("olga", operator=True))
    client = mlflow.MlflowClient()
    with pytest.raises(mlflow.exceptions.MlflowException) as refused:
        client.log_param(str(someone_elses.pk), "lr", "1")
    assert refused.value.error_code == "PERMISSION_DENIED"
    created = client.create_run("0", run_name="trl grpo", tags={"rlplane.framework": "trl"})
    client.log_batch(created.info.run_id,
                     metrics=[mlflow.entities.Metric("reward", 0.5, 0, 1)],
                     params=[mlflow.entities.Param("max_steps", "40")])
    client.set_terminated(created.info.run_id, "KILLED")

    run = Run.objects.get(pk=created.info.run_id)
    assert (run.name, run.framework, run.created_by.username) == ("trl-grpo", "trl", "olga")
    assert run.external_config.params["max_steps"] == 40
    assert points(run) == {(M.REWARD_MEAN, 1): 0.5}  # TRL's "reward", as rlplane names it
    assert run.status == RunStatus.STOPPED

    use_token(api_token("vic", operator=False))
    assert client.get_run(str(run.pk)).info.status == "KILLED"
    with pytest.raises(mlflow.exceptions.MlflowException) as refused:
        client.create_run("0")
    assert refused.value.error_code == "PERMISSION_DENIED"


def test_params_past_the_bound_are_dropped_and_counted_rather_than_failing_the_script():
    """veRL logs its whole flattened config; the client would raise a refusal into it."""
    config = {"name": "big", "framework": "verl", "params": {}}
    many = {f"actor_rollout_ref.key_{i:04d}": "x" * 200 for i in range(400)}  # ~90 KB

    merged = merged_config(config, many, {"mlflow.user": "ann"}, "0")

    kept = {k for k in merged["params"] if k.startswith("actor_rollout_ref.")}
    assert 0 < len(kept) < 400
    assert merged["params"]["mlflow"]["dropped"] == 400 - len(kept)
    assert merged["params"]["mlflow"]["tags"] == {"mlflow.user": "ann"}


def test_numeric_params_become_numbers_and_everything_else_stays_text():
    """MLflow sends every param as text; the run page reads an integer max_steps."""
    assert [param_value(v) for v in ("40", "1e-06", "True", "[1, 2]", "nan")] == [
        40, 1e-06, "True", "[1, 2]", "nan"]
    assert param_value("9007199254740993") == "9007199254740993"  # past 2**53: kept exact
    assert param_value("1" * 5000) == "1" * 5000  # no int() of thousands of digits
