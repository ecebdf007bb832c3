"""The read-only pages: runs list and run detail, as full pages and as htmx fragments."""

import json

import pytest

from engine.config import validate_config
from jobs.ingest.store import do_ingest_events
from jobs.models import RunStatus

from .helpers import checkpoint, log, metrics, span

HTMX = {"HX-Request": "true"}


@pytest.fixture
def viewer(client, django_user_model):
    client.force_login(django_user_model.objects.create_user("viewer"))
    return client


def run_data(response) -> dict:
    html, marker = response.content.decode(), '<script id="run-data" type="application/json">'
    start = html.index(marker) + len(marker)
    return json.loads(html[start:html.index("</script>", start)])


def chart(data, chart_id) -> dict:
    return next(c for c in data["charts"] if c["id"] == chart_id)


@pytest.mark.parametrize("path", ["/", "/runs/1"])
def test_an_anonymous_visitor_is_sent_to_the_login_page(client, db, path):
    response = client.get(path)

    assert response.status_code == 302
    assert response["Location"] == f"/login?next={path}"


def test_the_login_page_logs_a_user_in(client, django_user_model):
    django_user_model.objects.create_user("ada", password="a-long-password-1")

    page = client.get("/login")
    response = client.post("/login", {"username": "ada", "password": "a-long-password-1"})

    assert page.status_code == 200 and b'name="password"' in page.content
    assert response.status_code == 302 and response["Location"] == "/"


def test_logging_out_works_when_the_channel_layer_does_not(client, django_user_model,
                                                           monkeypatch):
    """The sockets' close is a courtesy: a Redis that is down or slow must not keep the
    session alive (Django flushes it after the signal that sends the close)."""
    import jobs.groups

    def down(*messages):
        raise ConnectionError("Redis is down")

    monkeypatch.setattr(jobs.groups, "group_send", down)
    client.force_login(django_user_model.objects.create_user("leaver"))

    response = client.post("/logout")

    assert response.status_code == 302 and "_auth_user_id" not in client.session


def test_the_runs_list_shows_each_runs_status_latest_reward_and_step_time(viewer, make_run):
    run = make_run(name="grpo-demo")
    make_run(name="queued one", status=RunStatus.QUEUED)
    do_ingest_events(run, [metrics(1, 1, **{"reward/mean": 0.25, "time/step_s": 2.0}),
                           metrics(2, 2, **{"reward/mean": 0.5, "time/step_s": 1.5})])

    response = viewer.get("/")

    html = response.content.decode()
    assert [t.name for t in response.templates][:2] == ["jobs/index.html", "base.html"]
    assert f'href="/runs/{run.pk}"' in html and "grpo-demo" in html
    assert f'id="run-{run.pk}-status" class="badge badge-running"' in html
    assert "0.500" in html and "1.50 s" in html
    assert '<td class="step">3</td>' in html   # steps 0, 1 and 2 trained, as in the header
    assert "badge-queued" in html
    assert "js/runs_list.js" in html and "vendor/htmx-2.0.4.min.js" in html
    assert html.index("js/live_socket.js") < html.index("js/runs_list.js")


def test_an_htmx_request_for_the_runs_list_gets_only_the_table(viewer, run):
    response = viewer.get("/", headers=HTMX)

    html = response.content.decode()
    assert '<table id="runs"' in html and "<html" not in html
    assert [t.name for t in response.templates][0] == "jobs/_runs_table.html"


def test_the_run_page_draws_its_charts_from_the_stored_metrics(viewer, run):
    do_ingest_events(run, [
        metrics(1, 1, **{"reward/mean": 0.2, "reward/std": 0.1, "time/rollout_s": 0.7}),
        span(2, 1), log(3),
        metrics(4, 2, **{"reward/mean": 0.4, "reward/std": 0.1, "time/rollout_s": 0.6,
                         "eval/reward_mean": 0.25}),
    ])

    data = run_data(viewer.get(f"/runs/{run.pk}"))

    assert data["last_seq"] == 4 and data["ws_path"] == f"/ws/runs/{run.pk}/"
    assert data["terminal_statuses"] == ["failed", "lost", "stopped", "succeeded"]
    # The header's live figures: the script reads their names here, not from literals.
    assert data["metric_names"] == {"reward": "reward/mean", "held_out": "eval/reward_mean"}
    lower, upper, mean, held_out = chart(data, "reward")["traces"]
    assert (mean["x"], mean["y"]) == ([1, 2], [0.2, 0.4])
    assert (held_out["name"], held_out["x"], held_out["y"]) == ("held-out", [2], [0.25])
    # When each step was reported (helpers.metrics: ts = 1000 + seq): the wall-time axis.
    assert data["step_times"] == {"1": 1001.0, "2": 1004.0}
    assert lower["y"] == pytest.approx([0.1, 0.3]) and upper["y"] == pytest.approx([0.3, 0.5])
    assert upper["fill"] == "tonexty"
    rollout = chart(data, "step_time")["traces"][0]
    assert rollout["name"] == "rollout" and rollout["y"] == [0.7, 0.6]
    bars = chart(data, "timeline")["traces"][0]
    assert bars["y"] == ["cpu:0"] and bars["base"] == [11000.0] and bars["x"] == [500.0]
    assert {c["id"] for c in data["charts"]} == {
        "reward", "step_time", "share", "staleness", "logprob_gap", "weight_sync",
        "device_util", "device_memory", "throughput", "response_length", "timeline"}


def test_the_device_charts_draw_what_each_device_measured_gpu_or_process(viewer, run):
    do_ingest_events(run, [
        metrics(1, 1, **{"device/gpu_util/gpu:0": 87.0, "device/cpu_util/gpu:1": 95.0,
                         "device/memory_gb/gpu:0": 31.5}),
        metrics(2, 2, **{"device/gpu_util/gpu:0": 91.0, "device/cpu_util/gpu:1": 40.0}),
    ])

    data = run_data(viewer.get(f"/runs/{run.pk}"))

    util = chart(data, "device_util")["traces"]
    assert (util[0]["name"], util[0]["x"], util[0]["y"]) == ("device 0", [1, 2], [87.0, 91.0])
    assert util[1]["y"] == [95.0, 40.0] and util[2]["y"] == []
    assert chart(data, "device_memory")["traces"][0]["y"] == [31.5]


def test_the_run_page_shows_the_config_as_toml_the_logs_and_the_checkpoints(viewer, run):
    do_ingest_events(run, [log(1, "warm start done"), checkpoint(2, 5)])

    response = viewer.get(f"/runs/{run.pk}")

    html = response.content.decode()
    assert 'name = &quot;t&quot;' in html and "steps = 3" in html
    assert "warm start done" in html
    assert "/ckpt/step_000005" in html
    assert 'id="run-status" class="badge badge-running"' in html
    assert "vendor/plotly-2.35.2.min.js" in html and "js/run_charts.js" in html
    assert html.index("js/live_socket.js") < html.index("js/run_charts.js")


def test_an_htmx_request_for_the_run_page_gets_its_panels_but_never_its_charts(viewer, run):
    do_ingest_events(run, [log(1, "hello there")])

    response = viewer.get(f"/runs/{run.pk}", headers=HTMX)

    html = response.content.decode()
    assert 'id="run-panels"' in html and "hello there" in html
    assert "chart-reward" not in html and "run-data" not in html and "<html" not in html


def test_a_viewer_sees_no_stop_or_fork_button(viewer, run):
    html = viewer.get(f"/runs/{run.pk}").content.decode()

    assert f"/runs/{run.pk}/stop" not in html and f"/runs/{run.pk}/fork" not in html


def test_an_operator_can_stop_a_live_run_and_fork_it(operator, run):
    html = operator.get(f"/runs/{run.pk}").content.decode()

    assert f'<form id="stop-form" method="post" action="/runs/{run.pk}/stop">' in html
    assert f'href="/runs/{run.pk}/fork"' in html


def test_a_finished_run_offers_fork_but_not_stop(operator, make_run):
    run = make_run(status=RunStatus.SUCCEEDED)

    html = operator.get(f"/runs/{run.pk}").content.decode()

    assert f"/runs/{run.pk}/stop" not in html and f'href="/runs/{run.pk}/fork"' in html


def test_a_submitting_run_offers_no_pause_or_checkpoint_until_its_driver_runs(
        operator, make_run):
    html = operator.get(f"/runs/{make_run(status=RunStatus.SUBMITTING).pk}").content.decode()

    assert '<div class="live-controls" id="live-controls" hidden>' in html
    running = operator.get(f"/runs/{make_run().pk}").content.decode()
    assert '<div class="live-controls" id="live-controls">' in running


def test_an_unknown_run_is_404(viewer, db):
    assert viewer.get("/runs/999").status_code == 404


@pytest.mark.parametrize("path", ["vendor/htmx-2.0.4.min.js", "vendor/plotly-2.35.2.min.js",
                                  "js/run_charts.js", "rlplane.css"])
def test_static_files_are_served_locally_without_collectstatic(client, path):
    response = client.get(f"/static/{path}")

    assert response.status_code == 200
    assert b"".join(response.streaming_content)


def test_a_run_whose_model_directory_moved_away_still_shows_and_updates(
        viewer, make_run, tmp_path):
    """model.path is checked when a run is launched, not each time its stored config is
    read again: after the directory is gone the page, a status change and the alert
    evaluation still work."""
    import json
    import shutil

    from jobs.alerts.lifecycle import do_evaluate_alerts
    from jobs.models import RunStatus

    model = tmp_path / "my-model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    (model / "model.safetensors").write_bytes(b"")
    (model / "tokenizer.json").write_text("{}")
    run = make_run(name="moved")
    run.config = {"model": {"path": str(model)}, "warm_start": {"steps": 0}}
    run.save()
    shutil.rmtree(model)

    assert viewer.get(f"/runs/{run.pk}").status_code == 200
    run.transition_to(RunStatus.STOPPING, "test")
    run.save()
    do_evaluate_alerts(run)


def test_the_run_header_names_the_model_the_dataset_and_how_it_runs(viewer, make_run):
    run = make_run(name="own-data")
    run.config = {"task": {"type": "dataset", "path": "data/gsm8k_sample/train.jsonl",
                           "eval_path": "data/gsm8k_sample/test.jsonl",
                           "prompt_key": "question", "answer_key": "answer"},
                  "reward": {"type": "math"}, "warm_start": {"steps": 0},
                  "placement": {"type": "disaggregated", "learner_devices": 2},
                  "weight_sync": {"type": "shm"}}
    run.save()

    html = viewer.get(f"/runs/{run.pk}").content.decode()

    facts = html[html.index('id="run-facts"'):html.index("</dl>")]
    for text in ("<dt>model</dt><dd>tiny</dd>",
                 "<dt>task</dt><dd>dataset data/gsm8k_sample/train.jsonl</dd>",
                 "<dt>reward</dt><dd>math</dd>",
                 "<dt>placement</dt><dd>disaggregated (1 rollout x 1, learner 2)</dd>"):
        assert text in facts, facts


def test_the_logprob_gap_chart_draws_moe_routing_agreement_beside_the_gap(viewer, run):
    do_ingest_events(run, [
        metrics(1, 1, **{"logprob_gap/mean": 2e-3, "moe/routing_agreement": 0.6}),
        metrics(2, 2, **{"logprob_gap/mean": 1e-7, "moe/routing_agreement": 1.0}),
    ])

    gap = chart(run_data(viewer.get(f"/runs/{run.pk}")), "logprob_gap")

    mean, _, agreement = gap["traces"]
    assert mean["y"] == [2e-3, 1e-7]
    assert agreement["name"] == "routing agreement" and agreement["yaxis"] == "y2"
    assert (agreement["x"], agreement["y"]) == ([1, 2], [0.6, 1.0])
    assert gap["layout"]["yaxis2"]["range"] == [0, 1]


def test_a_ppo_run_page_charts_its_critic_and_a_grpo_run_page_does_not(viewer, make_run, run):
    ppo = make_run(name="ppo")
    ppo.config = validate_config({"name": "ppo", "algorithm": {"type": "ppo"}}).model_dump(
        mode="json")
    ppo.save()
    do_ingest_events(ppo, [
        metrics(1, 1, **{"critic/value_loss": 0.24, "critic/explained_variance": -0.1,
                         "critic/value_mean": 0.0}),
        metrics(2, 2, **{"critic/value_loss": 0.11, "critic/explained_variance": 0.3,
                         "critic/value_mean": 0.2}),
        span(3, 1, phase="critic"),
    ])

    data = run_data(viewer.get(f"/runs/{ppo.pk}"))
    loss, explained, mean = chart(data, "critic")["traces"]
    assert (loss["x"], loss["y"]) == ([1, 2], [0.24, 0.11])
    assert explained["y"] == [-0.1, 0.3] and mean["y"] == [0.0, 0.2]
    timeline = {t["name"]: t for t in chart(data, "timeline")["traces"]}
    assert timeline["critic"]["x"] == [500.0] and timeline["critic"]["y"] == ["cpu:0"]
    assert "showlegend" not in timeline["critic"]
    grpo = run_data(viewer.get(f"/runs/{run.pk}"))
    assert "critic" not in {c["id"] for c in grpo["charts"]}
    # No critic in a GRPO run's legends (the trace stays: live updates index by place).
    for chart_id in ("step_time", "timeline"):
        [critic] = [t for t in chart(grpo, chart_id)["traces"] if t["name"] == "critic"]
        assert critic["showlegend"] is False
