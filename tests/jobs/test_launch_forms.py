"""New run, stop and fork: operator-only forms that validate through RunConfig and queue
nothing until the config is valid."""

import tomllib

import pytest
from django.contrib.auth.models import Group, User
from django.contrib.messages import get_messages

from engine.config import RunConfig, dump_config, union_choices, validate_config
from jobs.auth import OPERATOR_GROUP
from jobs.models import Checkpoint, Preset, Run, RunStatus
from jobs.runs.actions import Refused, do_fork_run
from jobs.runs.forms import RunConfigForm

from .helpers import checkpoint_on_disk

pytestmark = pytest.mark.django_db

GOOD = {"name": "demo", "steps": 5, "warm_start": {"steps": 0}}


@pytest.fixture
def operator(client):
    user = User.objects.create_user("olga")
    user.groups.add(Group.objects.get_or_create(name=OPERATOR_GROUP)[0])
    client.force_login(user)
    return user


@pytest.fixture
def viewer(client):
    user = User.objects.create_user("vic")
    client.force_login(user)
    return user


def form_data(config: dict | str, placement="colocated", async_policy="sync", **extra):
    text = config if isinstance(config, str) else dump_config(validate_config(config))
    return {"config": text, "placement": placement, "async_policy": async_policy, **extra}


def post_new(client, data, capture):
    with capture(execute=True):
        return client.post("/runs/new", data)


def test_the_new_run_form_starts_from_a_preset(client, operator):
    preset = Preset.objects.create(name="tiny demo", config={**GOOD, "steps": 7})

    page = client.get(f"/runs/new?preset={preset.pk}")

    assert page.status_code == 200
    form = page.context["form"]
    assert validate_config(tomllib.loads(form.initial["config"])).steps == 7
    assert form.initial["placement"] == "colocated" and form.initial["async_policy"] == "sync"
    html = page.content.decode()
    assert html.index('name="placement"') < html.index('name="config"')  # choices on top
    assert "tiny demo" in html and "csrfmiddlewaretoken" in html


def test_a_valid_config_launches_a_run_and_queues_its_submission(
        client, operator, queued, django_capture_on_commit_callbacks):
    response = post_new(client, form_data(GOOD), django_capture_on_commit_callbacks)

    run = Run.objects.get()
    assert response.status_code == 302 and response.url == f"/runs/{run.pk}"
    # Committed queued; the queue admitted it at once (a free run slot) and submitted it.
    assert (run.name, run.status, run.created_by) == ("demo", RunStatus.SUBMITTING, operator)
    assert run.config["steps"] == 5
    assert queued == [("submit", run.pk)]


def test_each_bad_field_is_named_next_to_its_path_and_nothing_is_queued(
        client, operator, queued, django_capture_on_commit_callbacks):
    bad = '''name = "demo"
[rollout]
temperature = 9
[algorithm]
group_size = 1
[placement]
devices = 0
'''
    response = post_new(client, form_data(bad), django_capture_on_commit_callbacks)

    assert response.status_code == 200
    form = response.context["form"]
    paths = [p.path for p in form.config_errors]
    assert set(paths) == {"rollout.temperature", "algorithm.group_size", "placement.devices"}
    assert any("rollout.temperature" in e for e in form.errors["config"])
    assert any("placement.devices" in e for e in form.errors["placement"])  # on its select
    html = response.content.decode()
    assert 'data-path="rollout.temperature"' in html and "(got 9)" in html
    assert Run.objects.count() == 0 and queued == []


def test_a_check_across_sections_lands_on_the_field_it_names(db):
    # RunConfig checks critic_devices against algorithm.type as a whole: pydantic places
    # the error at the root, and the path the check names takes it to the placement select
    form = RunConfigForm({"config": '[placement]\ncritic_devices = 1\n',
                          "algorithm": "grpo", "placement": "colocated", "async_policy": "sync"})

    assert not form.is_valid()
    assert [(p.path, p.line) for p in form.config_errors] == [("placement.critic_devices", 2)]
    assert any(e.startswith("placement.critic_devices: ") for e in form.errors["placement"])
    assert "config" not in form.errors


def test_text_that_is_not_toml_is_a_form_error(client, operator, queued,
                                                django_capture_on_commit_callbacks):
    response = post_new(client, form_data("steps = = 3"), django_capture_on_commit_callbacks)

    assert "not valid TOML" in response.content.decode()
    assert Run.objects.count() == 0 and queued == []


def test_an_unknown_placement_type_is_refused(client, operator, queued,
                                              django_capture_on_commit_callbacks):
    response = post_new(client, form_data(GOOD, placement="moon"),
                        django_capture_on_commit_callbacks)

    assert "placement" in response.context["form"].errors
    assert Run.objects.count() == 0 and queued == []


def test_the_tomls_type_launches_and_a_select_that_contradicts_it_is_an_error(client, operator):
    toml = '[placement]\ntype = "colocated"\ndevices = 2\n'
    form = RunConfigForm(form_data(toml, placement="colocated"))
    assert form.is_valid(), form.errors
    assert form.run_config.placement.devices == 2
    assert [t for t, _ in form.fields["placement"].choices] == ["colocated", "disaggregated"]

    clash = RunConfigForm(form_data(toml, placement="disaggregated"))

    assert not clash.is_valid()
    [problem] = clash.config_errors
    assert problem.path == "placement.type" and problem.line == 2
    assert "TOML says type = 'colocated'" in problem.message
    assert "'disaggregated'" in problem.message  # named, never silently replaced


def test_a_table_without_a_type_takes_the_selects_choice():
    form = RunConfigForm(form_data('[async_policy]\nmax_staleness = 3\n',
                                   async_policy="fully_async"))

    assert form.is_valid(), form.errors
    assert form.run_config.async_policy.type == "fully_async"
    assert form.run_config.async_policy.max_staleness == 3


DISAGG_ASYNC = """name = "pasted"
steps = 5

[warm_start]
steps = 0

[placement]
type = "disaggregated"
rollout_workers = 2
learner_devices = 1

[async_policy]
type = "fully_async"
max_staleness = 3

[weight_sync]
type = "shm"
"""


def test_a_pasted_disaggregated_fully_async_config_launches_as_written(
        client, operator, queued, django_capture_on_commit_callbacks):
    # What the page posts once its script has shown the TOML's types in the selects (the
    # browser test pastes without touching them).
    data = {"config": DISAGG_ASYNC, "placement": "disaggregated", "async_policy": "fully_async"}
    response = post_new(client, data, django_capture_on_commit_callbacks)

    run = Run.objects.get()
    assert response.status_code == 302
    assert run.config["placement"]["type"] == "disaggregated"
    assert run.config["placement"]["rollout_workers"] == 2
    assert run.config["async_policy"] == {**run.config["async_policy"], "type": "fully_async",
                                          "max_staleness": 3}


def validate(client, url, data):
    return client.post(url, {**data, "validate": "1"}, HTTP_HX_REQUEST="true")


def test_validate_shows_each_error_at_its_toml_line_and_saves_nothing(client, operator, queued):
    bad = DISAGG_ASYNC.replace("max_staleness = 3", "max_staleness = 99")

    response = validate(client, "/runs/new", form_data(bad, "disaggregated", "fully_async"))

    assert response.status_code == 200
    html = response.content.decode()
    line = bad.splitlines().index("max_staleness = 99") + 1
    assert f'data-path="async_policy.max_staleness" data-line="{line}"' in html
    assert f"{line} | max_staleness = 99" in html and "(got 99)" in html
    assert "<html" not in html                      # the fragment, not the page
    assert Run.objects.count() == 0 and queued == []


def test_an_unknown_key_points_at_its_line_and_a_missing_one_at_its_table():
    text = 'name = "x"\n[placement]\ntype = "colocated"\nrollout_workers = 2\n'
    form = RunConfigForm(form_data(text))

    assert not form.is_valid()
    [problem] = form.config_errors
    assert (problem.path, problem.line, problem.text) == (
        "placement.rollout_workers", 4, "rollout_workers = 2")
    assert "unknown key" in problem.message


def test_toml_that_does_not_parse_points_at_the_line_where_it_stops():
    form = RunConfigForm(form_data('name = "x"\nsteps = = 3\n'))

    assert not form.is_valid()
    assert form.config_errors[0].line == 2


def test_validate_previews_the_placement_against_the_clusters_capacity(
        client, operator, monkeypatch):
    monkeypatch.setattr("jobs.runs.queue.ray_capacity",
                        lambda: ({"GPU": 4.0, "CPU": 8.0}, {"GPU": 2.0, "CPU": 0.0}))

    response = validate(client, "/runs/new",
                        form_data(DISAGG_ASYNC, "disaggregated", "fully_async"))

    html = response.content.decode()
    assert 'data-bundles="3"' in html and 'data-fits="no"' in html
    assert "3 bundles (1 + 1 + 1 GPUs, PACK): 3 devices" in html
    assert "waits for 3 GPUs; 2 of 4 free" in html

    monkeypatch.setattr("jobs.runs.queue.ray_capacity",
                        lambda: ({"GPU": 4.0, "CPU": 8.0}, {"GPU": 0.0, "CPU": 0.0}))
    html = validate(client, "/runs/new",
                    form_data(DISAGG_ASYNC, "disaggregated", "fully_async")).content.decode()
    assert 'data-fits="yes"' in html and "4 of 4 GPUs free" in html


def test_a_placement_the_cluster_could_never_hold_is_refused_at_launch(
        client, operator, monkeypatch, queued, django_capture_on_commit_callbacks):
    monkeypatch.setattr("jobs.runs.queue.ray_capacity",   # a CPU-only stack: no GPU at all
                        lambda: ({"CPU": 4.0}, {"CPU": 0.0}))
    data = form_data(DISAGG_ASYNC, "disaggregated", "fully_async")
    html = validate(client, "/runs/new", data).content.decode()
    assert 'data-fits="no"' in html and "could ever hold" in html

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/runs/new", data)

    assert response.status_code == 200 and Run.objects.count() == 0 and queued == []
    [problem] = response.context["form"].config_errors
    assert problem.path == "placement"
    assert "asks for 3 GPUs and the Ray cluster has 0 in all" in problem.message


def test_validate_previews_the_in_process_default_as_a_run_slot(client, operator):
    html = validate(client, "/runs/new", form_data(GOOD)).content.decode()

    assert 'data-bundles="0"' in html and "one in-process run slot" in html
    assert 'data-fits="yes"' in html


def test_the_async_policy_select_offers_every_policy_the_config_accepts():
    form = RunConfigForm()

    offered = [t for t, _ in form.fields["async_policy"].choices]
    assert offered == union_choices("async_policy")
    assert {"sync", "one_step_off"} <= set(offered)
    for policy in offered:
        cfg = validate_config({**GOOD, "async_policy": {"type": policy}})
        assert cfg.async_policy.type == policy


def test_viewers_cannot_launch_stop_or_fork(client, viewer, make_run, queued):
    run = make_run()
    assert client.get("/runs/new").status_code == 403
    assert client.post("/runs/new", form_data(GOOD)).status_code == 403
    assert client.post(f"/runs/{run.pk}/stop").status_code == 403
    assert client.get(f"/runs/{run.pk}/fork").status_code == 403
    assert Run.objects.count() == 1 and queued == []


def test_anonymous_users_are_sent_to_log_in(client):
    response = client.get("/runs/new")
    assert response.status_code == 302 and "login" in response.url


def test_the_forms_check_csrf(operator):
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    strict.force_login(operator)
    assert strict.post("/runs/new", form_data(GOOD)).status_code == 403


def test_stop_asks_the_driver_and_queues_the_stop_task(
        client, operator, make_run, queued, django_capture_on_commit_callbacks):
    run = make_run(RunStatus.RUNNING)

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/runs/{run.pk}/stop")

    assert response.status_code == 302 and response.url == f"/runs/{run.pk}"
    run.refresh_from_db()
    assert run.status == RunStatus.STOPPING and run.stop_requested_at is not None
    assert queued == [("stop", run.pk)]


def test_stopping_a_finished_run_says_why_and_queues_nothing(
        client, operator, make_run, queued, django_capture_on_commit_callbacks):
    run = make_run(RunStatus.SUCCEEDED)

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/runs/{run.pk}/stop")

    assert response.status_code == 302
    notes = [str(m) for m in get_messages(response.wsgi_request)]
    assert any("which is final" in note for note in notes)
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED and run.stop_requested_at is None
    assert queued == []


def test_stop_only_accepts_post(client, operator, make_run):
    assert client.get(f"/runs/{make_run().pk}/stop").status_code == 405


@pytest.fixture
def parent(make_run):
    run = make_run(RunStatus.STOPPED, name="parent")
    Run.objects.filter(pk=run.pk).update(config=validate_config(GOOD).model_dump(mode="json"))
    run.refresh_from_db()
    for step in (2, 4):
        checkpoint_on_disk(run, step)
    return run


def test_the_fork_form_starts_from_the_parent_with_its_latest_checkpoint(client, operator,
                                                                         parent):
    page = client.get(f"/runs/{parent.pk}/fork")

    assert page.status_code == 200
    form = page.context["form"]
    assert form.initial["checkpoint"].step == 4
    cfg = validate_config(tomllib.loads(form.initial["config"]))
    assert cfg.name == "demo-fork" and cfg.steps == 5
    html = page.content.decode()
    assert 'class="field field-placement highlight"' in html
    assert 'class="field field-async_policy highlight"' in html


def test_a_fork_shows_the_diff_before_it_launches(
        client, operator, parent, queued, django_capture_on_commit_callbacks):
    checkpoint = parent.checkpoints.get(step=2)
    changed = {**GOOD, "name": "demo-fork", "steps": 9}
    data = form_data(changed, checkpoint=checkpoint.pk)

    with django_capture_on_commit_callbacks(execute=True):
        review = client.post(f"/runs/{parent.pk}/fork", data)

    assert review.status_code == 200 and Run.objects.count() == 1 and queued == []
    diff = review.context["diff"]
    assert "-steps = 5" in diff and "+steps = 9" in diff and '+name = "demo-fork"' in diff
    assert 'id="config-diff"' in review.content.decode()

    reviewed = review.context["form"]["reviewed"].value()
    with django_capture_on_commit_callbacks(execute=True):
        launch = client.post(f"/runs/{parent.pk}/fork", {**data, "reviewed": reviewed})

    fork = Run.objects.exclude(pk=parent.pk).get()
    assert launch.status_code == 302 and launch.url == f"/runs/{fork.pk}"
    assert (fork.parent, fork.source_checkpoint) == (parent, checkpoint.path)
    assert fork.config["steps"] == 9
    assert queued == [("submit", fork.pk)]
    assert "Trains 7 more steps: from run" in review.content.decode()   # step 2 -> 9


def test_a_config_changed_after_the_review_is_shown_again(
        client, operator, parent, queued, django_capture_on_commit_callbacks):
    data = form_data({**GOOD, "steps": 9}, checkpoint=parent.checkpoints.first().pk)
    review = client.post(f"/runs/{parent.pk}/fork", data)
    reviewed = review.context["form"]["reviewed"].value()

    edited = {**form_data({**GOOD, "steps": 11}), "checkpoint": data["checkpoint"],
              "reviewed": reviewed}
    with django_capture_on_commit_callbacks(execute=True):
        again = client.post(f"/runs/{parent.pk}/fork", edited)

    assert again.status_code == 200 and "+steps = 11" in again.context["diff"]
    assert Run.objects.count() == 1 and queued == []


def test_a_run_without_checkpoints_cannot_be_forked(client, operator, make_run):
    response = client.get(f"/runs/{make_run().pk}/fork")
    assert response.status_code == 409 and "no checkpoint" in response.content.decode()


def test_a_checkpoint_of_another_run_is_not_a_choice(client, operator, parent, make_run,
                                                     queued):
    other = make_run()
    foreign = Checkpoint.objects.create(run=other, step=1, version=1, path="/x/step_000001")
    response = client.post(f"/runs/{parent.pk}/fork", form_data(GOOD, checkpoint=foreign.pk))
    assert "checkpoint" in response.context["form"].errors
    assert queued == []


def test_defaults_fill_the_form_when_there_is_no_preset(client, operator):
    form = client.get("/runs/new").context["form"]
    assert form.initial["config"] == dump_config(RunConfig())


def test_a_checkpoint_the_run_deleted_is_neither_offered_nor_forked_from(
        client, operator, parent, queued):
    """Issue 19 item 10: a run keeps its last keep_last checkpoints; the fork form once
    offered the deleted ones and the fork then failed at start."""
    import shutil

    gone = parent.checkpoints.get(step=4)
    shutil.rmtree(gone.directory())

    page = client.get(f"/runs/{parent.pk}/fork")

    assert [c.step for c in page.context["form"].fields["checkpoint"].queryset] == [2]
    with pytest.raises(Exception, match="no longer on disk"):
        from jobs.runs.actions import do_fork_run
        do_fork_run(None, parent, gone, parent.config)


def test_a_fork_starts_from_the_runs_own_directory_not_the_path_the_driver_sent(
        client, operator, parent, queued):
    """Issue 19 item 4: the path comes from an ingest event, which a run token writes."""
    from jobs.runs.actions import do_fork_run

    checkpoint = parent.checkpoints.get(step=4)
    Checkpoint.objects.filter(pk=checkpoint.pk).update(path="/home/victim/evil.pt")
    checkpoint.refresh_from_db()

    fork = do_fork_run(None, parent, checkpoint, parent.config)

    assert fork.source_checkpoint == str(checkpoint.directory())
    assert fork.source_checkpoint.endswith(f"run-{parent.pk}/checkpoints/step_000004")


def test_the_fork_form_validates_the_same_way_and_launches_nothing(client, operator, parent,
                                                                   queued):
    page = client.get(f"/runs/{parent.pk}/fork").content.decode()
    assert f'hx-post="/runs/{parent.pk}/fork"' in page and 'data-toml-table="placement"' in page
    bad = DISAGG_ASYNC.replace("rollout_workers = 2", "rollout_workers = 0")
    checkpoint = parent.checkpoints.first().pk

    html = validate(client, f"/runs/{parent.pk}/fork",
                    form_data(bad, "disaggregated", "fully_async",
                              checkpoint=checkpoint)).content.decode()

    line = bad.splitlines().index("rollout_workers = 0") + 1
    assert f'data-path="placement.rollout_workers" data-line="{line}"' in html
    assert Run.objects.count() == 1 and queued == []


def test_a_fork_that_would_train_nothing_is_refused_naming_steps(
        client, operator, parent, queued, django_capture_on_commit_callbacks):
    # steps is where the fork trains to: 4 from the checkpoint at step 4 trains nothing.
    data = form_data({**GOOD, "steps": 4}, checkpoint=parent.checkpoints.get(step=4).pk)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/runs/{parent.pk}/fork", data)

    [problem] = response.context["form"].config_errors
    assert problem.path == "steps" and "would train nothing" in problem.message
    assert "steps = 8 trains 4 more" in problem.message
    assert Run.objects.count() == 1 and queued == []


def test_the_fork_form_of_a_finished_run_trains_as_many_steps_again(
        client, operator, parent):
    Run.objects.filter(pk=parent.pk).update(config={**parent.config, "steps": 4})
    form = client.get(f"/runs/{parent.pk}/fork").context["form"]
    assert validate_config(tomllib.loads(form.initial["config"])).steps == 8   # 4 -> 8


# --------------------------------------------------------------------------- algorithm

def test_the_run_forms_offer_the_algorithm_choice(client, operator, parent):
    for url in ("/runs/new", f"/runs/{parent.pk}/fork"):
        form = client.get(url).context["form"]
        assert [t for t, _ in form.fields["algorithm"].choices] == union_choices("algorithm")
        assert {"grpo", "ppo"} <= set(union_choices("algorithm"))
        assert form.initial.get("algorithm", "grpo") == "grpo"
    html = client.get(f"/runs/{parent.pk}/fork").content.decode()
    assert 'name="algorithm"' in html and 'class="field field-algorithm highlight"' in html


def test_the_algorithm_select_sets_a_config_without_an_algorithm_type(client, operator,
                                                                      queued):
    toml = 'name = "demo"\n[warm_start]\nsteps = 0\n[algorithm]\nlam = 0.9\n'   # PPO's
    form = RunConfigForm(form_data(toml, algorithm="ppo"))
    assert form.is_valid(), form.errors
    assert form.run_config.algorithm.type == "ppo" and form.run_config.algorithm.lam == 0.9


PPO = {**GOOD, "name": "demo-ppo", "algorithm": {"type": "ppo"}}


def test_a_fork_of_a_grpo_run_to_ppo_is_refused_naming_critic_path(
        client, operator, parent, queued, django_capture_on_commit_callbacks):
    data = form_data(PPO, algorithm="ppo", checkpoint=parent.checkpoints.first().pk)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(f"/runs/{parent.pk}/fork", data)

    form = response.context["form"]
    assert not form.is_valid() and Run.objects.count() == 1 and queued == []
    [problem] = form.config_errors
    assert problem.path == "algorithm.critic.path"
    assert "without a critic" in problem.message and "algorithm.critic.path" in problem.message
    assert "algorithm.critic.path" in " ".join(form.errors["algorithm"])


def test_a_fork_of_a_grpo_run_to_ppo_with_a_critic_path_launches(
        client, operator, parent, queued, django_capture_on_commit_callbacks, tmp_path):
    for name in ("config.json", "model.safetensors"):        # what the validator looks for
        (tmp_path / name).write_text("{}")
    with_critic = {**PPO, "algorithm": {"type": "ppo", "critic": {"path": str(tmp_path)}}}
    data = form_data(with_critic, algorithm="ppo", checkpoint=parent.checkpoints.first().pk)
    review = client.post(f"/runs/{parent.pk}/fork", data)
    assert review.context["form"].is_valid(), review.context["form"].errors
    reviewed = review.context["form"]["reviewed"].value()
    with django_capture_on_commit_callbacks(execute=True):
        launch = client.post(f"/runs/{parent.pk}/fork", {**data, "reviewed": reviewed})

    fork = Run.objects.exclude(pk=parent.pk).get()
    assert launch.status_code == 302 and fork.config["algorithm"]["type"] == "ppo"
    assert queued == [("submit", fork.pk)]


def test_the_fork_action_refuses_it_too(operator, parent):   # the REST API's way in
    with pytest.raises(Refused, match="algorithm.critic.path"):
        do_fork_run(operator, parent, parent.checkpoints.first(),
                    validate_config(PPO).model_dump(mode="json"))
    assert Run.objects.count() == 1


def test_a_fork_of_a_ppo_run_keeps_its_critic_and_needs_no_path(parent):
    Run.objects.filter(pk=parent.pk).update(
        config=validate_config(PPO).model_dump(mode="json"))
    parent.refresh_from_db()
    assert parent.fork_problem(validate_config(PPO).model_dump(mode="json")) is None
    assert parent.fork_problem(validate_config(GOOD).model_dump(mode="json")) is None


def test_validate_names_the_algorithm_it_would_launch(client, operator, monkeypatch):
    monkeypatch.setattr("jobs.runs.queue.ray_capacity",
                        lambda: ({"GPU": 4.0, "CPU": 8.0}, {"GPU": 4.0, "CPU": 8.0}))
    response = validate(client, "/runs/new", form_data(PPO, algorithm="ppo"))
    assert "Valid: ppo, colocated placement, sync policy." in response.content.decode()
