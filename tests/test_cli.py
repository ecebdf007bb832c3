"""The `rlplane` CLI against the control plane's REST API, served over real HTTP by
pytest-django's live server: what it prints, where it keeps the token, and the exit codes
a script relies on (rlplane.client EXIT_*)."""

import stat

import pytest

from jobs.models import Run, RunControl, RunStatus
from jobs.runs import submit, tasks
from rlplane import client as c
from rlplane.cli import main

from .jobs.helpers import api_token

pytestmark = pytest.mark.django_db(transaction=True)

GOOD = 'name = "cli-run"\nsteps = 5\n[warm_start]\nsteps = 0\n'


@pytest.fixture(autouse=True)
def config_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("RLPLANE_CONFIG_DIR", str(tmp_path / "cfg"))
    return tmp_path / "cfg"


@pytest.fixture
def submitted(monkeypatch):
    calls = []
    monkeypatch.setattr(submit.submit_run, "delay", calls.append)
    monkeypatch.setattr(tasks.stop_run, "delay", calls.append)
    return calls


@pytest.fixture
def logged_in(live_server):
    assert main(["login", live_server.url, "--token", api_token("olga", operator=True)]) == 0
    return live_server.url


def test_login_keeps_the_token_readable_only_by_its_owner(live_server, config_dir, capsys):
    raw = api_token("olga", operator=True)

    assert main(["login", live_server.url, "--token", raw]) == c.EXIT_OK

    path = config_dir / "credentials.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and raw in path.read_text()
    assert "logged in" in capsys.readouterr().out


def test_login_with_a_bad_token_saves_nothing_and_exits_3(live_server, config_dir, capsys):
    assert main(["login", live_server.url, "--token", "rlp_wrong"]) == c.EXIT_AUTH
    assert not (config_dir / "credentials.json").exists()
    assert "unknown or revoked" in capsys.readouterr().err
    assert main(["runs"]) == c.EXIT_AUTH  # never logged in


def test_launch_with_overrides_then_list_and_stop(logged_in, tmp_path, capsys, submitted):
    config = tmp_path / "run.toml"
    config.write_text(GOOD)

    assert main(["launch", str(config), "--set", "rollout.temperature=0.7",
                 "--set", 'name="cli-set"', "-q"]) == c.EXIT_OK
    run_id = int(capsys.readouterr().out.strip())
    run = Run.objects.get(pk=run_id)
    assert (run.name, run.config["rollout"]["temperature"]) == ("cli-set", 0.7)
    assert run.status == RunStatus.SUBMITTING and submitted == [run_id]

    assert main(["runs"]) == c.EXIT_OK
    assert "cli-set" in capsys.readouterr().out
    Run.objects.filter(pk=run_id).update(status=RunStatus.RUNNING)
    assert main(["stop", str(run_id)]) == c.EXIT_OK
    assert "stopping" in capsys.readouterr().out
    Run.objects.filter(pk=run_id).update(status=RunStatus.STOPPED)
    assert main(["stop", str(run_id)]) == c.EXIT_CONFLICT
    assert "final" in capsys.readouterr().err


def test_a_bad_config_is_refused_locally_with_each_field_and_exit_2(logged_in, tmp_path,
                                                                     capsys):
    config = tmp_path / "run.toml"
    config.write_text(GOOD)

    assert main(["launch", str(config), "--set", "rollout.temperature=9"]) == c.EXIT_USAGE

    err = capsys.readouterr().err
    assert "rollout.temperature:" in err and "(got 9)" in err
    assert Run.objects.count() == 0


def test_a_config_the_server_refuses_prints_each_field_path_from_its_answer(
        logged_in, tmp_path, capsys, monkeypatch):
    # skip the local check
    monkeypatch.setattr("rlplane.cli.validate_config", lambda data, check_files: None)
    config = tmp_path / "short.toml"
    config.write_text(GOOD + "[rollout]\nmax_new_tokens = 1\n")

    assert main(["launch", str(config)]) == c.EXIT_USAGE
    err = capsys.readouterr().err
    assert "rlplane: invalid run config" in err
    assert "\n  rollout.max_new_tokens: rollout.max_new_tokens=1 cannot hold" in err
    assert Run.objects.count() == 0


def test_a_viewer_cannot_launch_exit_4(live_server, tmp_path, capsys):
    main(["login", live_server.url, "--token", api_token("vic", operator=False)])
    config = tmp_path / "run.toml"
    config.write_text(GOOD)

    assert main(["launch", str(config)]) == c.EXIT_FORBIDDEN
    assert "operators only" in capsys.readouterr().err


def test_missing_runs_and_a_dead_server_have_their_own_codes(logged_in, config_dir, capsys):
    assert main(["stop", "999999"]) == c.EXIT_NOT_FOUND
    c.save_credentials("http://127.0.0.1:9", "rlp_x")  # port 9: nothing listens
    assert main(["runs"]) == c.EXIT_UNREACHABLE
    assert "did not answer" in capsys.readouterr().err


def test_a_queued_run_is_reprioritized_and_watch_returns_once_the_run_ended(logged_in, capsys,
                                                                     settings):
    waiting = Run.objects.create(name="w", config={"name": "w", "steps": 3},
                                 status_reason="waits for 1 run slot; 0 of 1 free")

    assert main(["priority", str(waiting.pk), "4"]) == c.EXIT_OK
    assert main(["baseline", str(waiting.pk), str(waiting.pk)]) == c.EXIT_USAGE
    early = capsys.readouterr()
    assert "baseline_run: run #" in early.err and "priority 4" in early.out
    assert main(["baseline", str(waiting.pk), "none"]) == c.EXIT_OK
    Run.objects.filter(pk=waiting.pk).update(status=RunStatus.STOPPED)
    assert main(["watch", str(waiting.pk), "--interval", "0.01"]) == c.EXIT_OK

    out = capsys.readouterr().out
    assert "throughput baseline the default" in out and f"run={waiting.pk} status=stopped" in out
    assert Run.objects.get(pk=waiting.pk).priority == 4


def test_fork_with_a_changed_field_alerts_and_logs(logged_in, capsys, submitted, settings,
                                                   tmp_path):
    settings.RLPLANE_RUNS_DIR = tmp_path / "runs"
    from jobs.models import Alert, RunEvent

    parent = Run.objects.create(name="p", config={"name": "p", "steps": 3},
                                status=RunStatus.STOPPED)
    from tests.jobs.helpers import checkpoint_on_disk
    checkpoint = checkpoint_on_disk(parent, 2)
    alert = Alert.objects.create(run=parent, kind="BubbleHigh", dedup_key="b",
                                 cause="the devices idled", runbook="r")
    RunEvent.objects.create(run=parent, seq=1, type="log", ts=1.0,
                            payload={"seq": 1, "type": "log", "message": "hello from p"})

    assert main(["fork", str(parent.pk), "--set", "steps=9", "-q"]) == c.EXIT_OK
    child = Run.objects.get(pk=int(capsys.readouterr().out.strip()))
    assert (child.parent_id, child.config["steps"], child.name) == (parent.pk, 9, "p-fork")
    assert child.source_checkpoint == checkpoint.path

    assert main(["alerts", "--run", str(parent.pk)]) == c.EXIT_OK
    assert "BubbleHigh" in capsys.readouterr().out
    assert main(["alerts", "--ack", str(alert.pk)]) == c.EXIT_OK
    assert "acknowledged" in capsys.readouterr().out
    assert main(["logs", str(parent.pk)]) == c.EXIT_OK
    assert "hello from p" in capsys.readouterr().out


def test_a_fork_that_would_train_nothing_is_refused_with_the_fix(logged_in, capsys,
                                                                 submitted, settings, tmp_path):
    settings.RLPLANE_RUNS_DIR = tmp_path / "runs"
    from tests.jobs.helpers import checkpoint_on_disk

    parent = Run.objects.create(name="p", config={"name": "p", "steps": 3},
                                status=RunStatus.STOPPED)
    checkpoint_on_disk(parent, 3)

    assert main(["fork", str(parent.pk), "--set", "steps=2"]) != c.EXIT_OK
    assert "would train nothing" in capsys.readouterr().err
    assert Run.objects.count() == 1 and submitted == []


DATASET = GOOD + '[task]\ntype = "dataset"\npath = "/on/the/cluster/train.jsonl"\n'


def test_launch_leaves_the_configs_files_to_the_server(logged_in, tmp_path, capsys,
                                                       submitted):
    from rlplane.cli import config_with_overrides

    config = tmp_path / "run.toml"
    config.write_text(DATASET)
    # A laptop checks syntax and bounds; the data may live only where the run runs...
    assert config_with_overrides(config, [])["task"]["path"] == "/on/the/cluster/train.jsonl"
    # ...and the server, which can look, names the field when it is not there either.
    assert main(["launch", str(config)]) == c.EXIT_USAGE
    err = capsys.readouterr().err
    assert "task.path" in err and Run.objects.count() == 0


def test_watch_on_a_terminal_draws_the_table_with_the_open_alerts(logged_in):
    import io

    from rich.console import Console

    from jobs.models import Alert, MetricPoint
    from rlplane.watch import watch

    run = Run.objects.create(name="w", config={"name": "w", "steps": 3},
                             status=RunStatus.SUCCEEDED)
    MetricPoint.objects.create(run=run, step=7, name="reward/mean", value=0.625)
    MetricPoint.objects.create(run=run, step=5, name="eval/reward_mean", value=0.5)
    Alert.objects.create(run=run, kind="StuckReward", dedup_key="s", cause="reward is flat",
                         runbook="r")
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=120, color_system=None)

    assert watch(c.Client.from_credentials(), run.pk, 0.01, None, console) == c.EXIT_OK

    drawn = screen.getvalue()
    for text in ("succeeded", "step 7", "0.625", "held-out reward", "0.5", "open alerts",
                 "StuckReward", "reward is flat"):
        assert text in drawn, text


def test_live_controls_from_the_cli_and_a_bad_value_exits_2_naming_it(logged_in, capsys):
    run = Run.objects.create(name="r", config={"name": "r", "steps": 3})
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    rid = str(run.pk)

    for args in (["pause", rid], ["resume", rid], ["checkpoint", rid],
                 ["set-lr", rid, "5e-5"], ["set-eval-every", rid, "4"]):
        assert main(args) == c.EXIT_OK, args
    assert "applied after the step in progress" in capsys.readouterr().out
    assert list(RunControl.objects.values_list("kind", "value")) == [
        ("pause", None), ("resume", None), ("checkpoint", None), ("set_lr", 5e-5),
        ("set_eval_every", 4.0)]

    assert main(["set-lr", rid, "0"]) == c.EXIT_USAGE
    assert "value: Input should be greater than 0" in capsys.readouterr().err
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    assert main(["pause", rid]) == c.EXIT_CONFLICT
    assert "live controls need a running run" in capsys.readouterr().err
