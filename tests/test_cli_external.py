"""`rlplane launch-command` and `rlplane track-run` (issue 29) against pytest-django's live
server: what reaches the control plane, what is printed for a shell to eval, and the
fields a bad run names."""

import shlex

import pytest

from jobs.models import Run, RunStatus
from rlplane import client as c
from rlplane.cli import main

from .jobs.helpers import api_token
from .test_cli import config_dir, logged_in, submitted  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)


def test_launch_command_queues_the_command_after_the_double_dash(logged_in, capsys,  # noqa: F811
                                                                 submitted):  # noqa: F811
    assert main(["launch-command", "--framework", "trl", "--name", "grpo", "--cpus", "2",
                 "--gpus", "1", "--working-dir", "/srv/trl", "--env", "HF_HOME=/cache",
                 "--pip", "trl==0.19.1", "--param", "max_steps=40", "-q",
                 "--", "python", "train.py", "--run_name", "a b"]) == c.EXIT_OK

    run = Run.objects.get(pk=int(capsys.readouterr().out.strip()))
    launch = run.external_config.launch
    assert run.framework == "trl" and run.external_config.params == {"max_steps": 40}
    assert launch.entrypoint == "python train.py --run_name 'a b'"
    assert (launch.cpus, launch.gpus, launch.working_dir) == (2.0, 1, "/srv/trl")
    assert (launch.env, launch.pip) == ({"HF_HOME": "/cache"}, ["trl==0.19.1"])
    assert run.status in (RunStatus.QUEUED, RunStatus.SUBMITTING)


def test_track_run_prints_the_exports_a_shell_evals(logged_in, capsys):  # noqa: F811
    assert main(["track-run", "--framework", "verl", "--name", "ppo"]) == c.EXIT_OK

    out, err = capsys.readouterr()
    exports = dict(shlex.split(line.removeprefix("export "))[0].split("=", 1)
                   for line in out.splitlines())
    run = Run.objects.get(pk=int(exports["RLPLANE_RUN_ID"]))
    assert run.status == RunStatus.RUNNING and run.framework == "verl"
    assert run.has_ingest_token(exports["RLPLANE_TOKEN"])
    assert exports["RLPLANE_URL"] == logged_in
    assert exports["MLFLOW_TRACKING_URI"] == f"{logged_in}/mlflow"
    assert exports["MLFLOW_TRACKING_TOKEN"] == exports["RLPLANE_TOKEN"]
    assert f"/runs/{run.pk}" in err


def test_a_bad_external_run_is_refused_locally_naming_the_field(logged_in, capsys):  # noqa: F811
    assert main(["launch-command", "--framework", "script", "--name", "x",
                 "--env", "RLPLANE_TOKEN=mine", "--", "python", "t.py"]) == c.EXIT_USAGE
    assert "launch.env: RLPLANE_TOKEN is set by rlplane" in capsys.readouterr().err
    assert main(["launch-command", "--framework", "script", "--name", "x"]) == c.EXIT_USAGE
    assert "no command" in capsys.readouterr().err
    assert not Run.objects.exists()


def test_a_viewer_cannot_track_a_run(live_server, capsys):
    main(["login", live_server.url, "--token", api_token("vic", operator=False)])
    assert main(["track-run", "--framework", "trl", "--name", "x"]) == c.EXIT_FORBIDDEN


def test_logs_prints_what_the_run_reported_then_its_commands_output(logged_in, capsys,  # noqa: F811
                                                                     client):
    from engine.api import LogEvent
    from jobs.models import RunEvent
    from jobs.runs.job_logs import do_store_job_log

    run = Run.objects.create(name="cmd", config={"name": "cmd", "framework": "script",
                                                  "launch": {"entrypoint": "python t.py"}})
    RunEvent.objects.create(run=run, seq=1, type="log", ts=1.0,
                            payload=LogEvent(seq=1, ts=1.0, message="reported").to_dict())
    do_store_job_log(run, "loading\nepoch 1\n", job_ended=False)

    assert main(["logs", str(run.pk)]) == c.EXIT_OK

    assert capsys.readouterr().out.splitlines() == ["     1 reported", "   job loading",
                                                    "   job epoch 1"]
    token = api_token("vic", operator=False)
    page = client.get(f"/api/v1/runs/{run.pk}/job-log?after_line=1",
                      headers={"Authorization": f"Bearer {token}"}).json()
    assert [(x["line"], x["message"]) for x in page["lines"]] == [(2, "epoch 1")]
    assert page["last_line"] == 2
