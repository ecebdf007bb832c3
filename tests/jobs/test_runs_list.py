"""The runs list (columns, filters, compare selection), archive / restore / delete, and the
run page header's progress."""

import html
import re

import pytest
from django.test import Client
from django.utils import timezone

from jobs.ingest.store import do_ingest_events
from jobs.models import (
    Alert,
    AlertChannel,
    Checkpoint,
    MetricPoint,
    Notification,
    PhaseSpan,
    Run,
    RunControl,
    RunEvent,
    RunStatus,
)
from jobs.models.run import run_directory

from .helpers import api_token, checkpoint_on_disk, log, metrics, span

HTMX = {"HX-Request": "true"}
DISAGGREGATED = {"name": "t", "steps": 3, "placement": {"type": "disaggregated"},
                 "async_policy": {"type": "one_step_off"}, "weight_sync": {"type": "shm"}}


@pytest.fixture
def viewer(client, django_user_model):
    client.force_login(django_user_model.objects.create_user("viewer"))
    return client


def listed(response) -> set[str]:
    """The run names the list's table shows."""
    return {run.name for run in response.context["runs"]}


def test_the_list_shows_placement_policy_algorithm_held_out_reward_and_open_alerts(
        viewer, make_run):
    run = Run.objects.create(name="disagg", config=DISAGGREGATED)
    do_ingest_events(run, [metrics(1, 1, **{"reward/mean": 0.5, "eval/reward_mean": 0.625})])
    Alert.objects.create(run=run, kind="BubbleHigh", dedup_key="a", cause="c", runbook="r")
    Alert.objects.create(run=run, kind="StuckReward", dedup_key="b", cause="c", runbook="r",
                         state="resolved")

    html = viewer.get("/").content.decode()

    row = html[html.index(f'<tr id="run-{run.pk}"'):]
    row = row[:row.index("</tr>")]
    assert '<td class="placement">disaggregated</td>' in row
    assert '<td class="policy">one_step_off</td>' in row
    assert '<td class="algorithm">grpo</td>' in row
    assert '<td class="held-out">0.625</td>' in row
    assert f'href="/alerts?run={run.pk}">1</a>' in row  # the resolved one is not open
    assert f'name="ids" value="{run.pk}" form="compare-form"' in row


@pytest.mark.parametrize("query, shown", [
    ("", {"a-colo", "b-disagg", "c-stopped"}),
    ("?status=stopped", {"c-stopped"}),
    ("?name=DISAGG", {"b-disagg"}),
    ("?config=placement.type=disaggregated", {"b-disagg"}),
    ("?config=async_policy.type%3Done_step_off", {"b-disagg"}),
    ("?config=steps=3", {"a-colo", "b-disagg", "c-stopped"}),
    ("?config=steps=4", set()),
    ("?config=placement.contains=x", set()),  # a key, never a lookup
    ("?archived=1", {"a-colo", "b-disagg", "c-stopped", "d-archived"}),
    ("?archived=1&status=stopped", {"c-stopped", "d-archived"}),
])
def test_the_list_filters_by_status_name_config_value_and_archived(viewer, make_run, query,
                                                                   shown):
    make_run(name="a-colo")
    Run.objects.create(name="b-disagg", config=DISAGGREGATED)
    make_run(name="c-stopped", status=RunStatus.STOPPED)
    make_run(name="d-archived", status=RunStatus.STOPPED, archived_at=timezone.now())

    page, fragment = viewer.get("/" + query), viewer.get("/" + query, headers=HTMX)

    assert listed(page) == shown and listed(fragment) == shown
    # The table's own reload keeps the filters.
    assert f'<table id="runs" class="runs" hx-get="/{query}"' in html.unescape(
        fragment.content.decode())


@pytest.mark.parametrize("query, says", [
    ("?status=sleeping", "status: 'sleeping' is no status"),
    ("?config=placement.type", "config: write key=value"),
    ("?config=plcement.type=colocated", "config: 'plcement' is no config section"),
    ("?config=placement..type=x", "config: write key=value"),
    ("?config=__class__=x", "config: '__class__' is no config section"),
])
def test_a_bad_filter_is_named_above_an_empty_table(viewer, make_run, query, says):
    make_run()

    response = viewer.get("/" + query)

    assert response.status_code == 200 and listed(response) == set()
    assert says in html.unescape(response.content.decode())


# --- archive / restore ----------------------------------------------------------------------

def test_an_operator_archives_a_finished_run_and_restores_it(operator, make_run):
    run = make_run(name="old", status=RunStatus.SUCCEEDED)

    archived = operator.post(f"/runs/{run.pk}/archive")
    hidden = listed(operator.get("/"))
    shown = listed(operator.get("/?archived=1"))
    page = operator.get(f"/runs/{run.pk}").content.decode()
    restored = operator.post(f"/runs/{run.pk}/restore")

    assert archived.status_code == 302 and archived["Location"] == f"/runs/{run.pk}"
    assert "old" not in hidden and "old" in shown
    assert 'id="restore-form"' in page and 'id="archive-form"' not in page
    assert restored.status_code == 302
    run.refresh_from_db()
    assert run.archived_at is None and "old" in listed(operator.get("/"))


def test_a_running_run_is_neither_archived_nor_offered_archive(operator, run):
    response = operator.post(f"/runs/{run.pk}/archive", follow=True)

    run.refresh_from_db()
    assert run.archived_at is None
    assert "only a finished run can be archived" in response.content.decode()
    page = operator.get(f"/runs/{run.pk}").content.decode()
    # Both wait hidden: run_charts.js shows them when the run ends with its page open.
    assert re.search(r'<form id="archive-form"[^>]* hidden>', page)
    assert re.search(r'<form id="delete-form"[^>]* hidden ', page)


# --- delete ---------------------------------------------------------------------------------

def run_with_everything(make_run, name: str) -> Run:
    """A finished run with a row in every table that hangs off a run, and files on disk."""
    run = make_run(name=name, status=RunStatus.RUNNING)
    do_ingest_events(run, [metrics(1, 1, **{"reward/mean": 0.5}), span(2, 1), log(3)])
    checkpoint_on_disk(run, 1)
    (run_directory(run.pk) / "spool").mkdir()
    (run_directory(run.pk) / "spool" / "events.jsonl").write_text("{}\n")
    alert = Alert.objects.create(run=run, kind="BubbleHigh", dedup_key="a", cause="c",
                                 runbook="r")
    channel = AlertChannel.objects.create(name=f"hook-{name}", kind="webhook",
                                          target="https://example.org/hook")
    Notification.objects.create(alert=alert, channel=channel, event="open")
    RunControl.objects.create(run=run, kind="pause")
    Run.objects.filter(pk=run.pk).update(status=RunStatus.STOPPED)
    run.refresh_from_db()
    return run


def rows_of(run_id: int) -> dict[str, int]:
    return {model.__name__: model.objects.filter(run_id=run_id).count()
            for model in (RunEvent, MetricPoint, PhaseSpan, Checkpoint, Alert, RunControl)} \
        | {"Notification": Notification.objects.filter(alert__run_id=run_id).count(),
           "Run": Run.objects.filter(pk=run_id).count()}


def test_delete_removes_every_row_and_file_of_the_run_and_nothing_of_another(
        operator, make_run, django_capture_on_commit_callbacks):
    doomed, kept = run_with_everything(make_run, "doomed"), run_with_everything(make_run, "kept")
    kept_rows, kept_files = rows_of(kept.pk), sorted(run_directory(kept.pk).rglob("*"))
    assert all(kept_rows.values()) and all(rows_of(doomed.pk).values())

    with django_capture_on_commit_callbacks(execute=True):
        response = operator.post(f"/runs/{doomed.pk}/delete")

    assert response.status_code == 302 and response["Location"] == "/"
    assert set(rows_of(doomed.pk).values()) == {0}
    assert not run_directory(doomed.pk).exists()
    assert rows_of(kept.pk) == kept_rows
    assert sorted(run_directory(kept.pk).rglob("*")) == kept_files
    assert "doomed" not in listed(operator.get("/"))


@pytest.mark.parametrize("status", [RunStatus.RUNNING, RunStatus.SUBMITTING, RunStatus.QUEUED,
                                    RunStatus.STOPPING])
def test_delete_is_refused_while_the_run_is_not_finished(operator, make_run, status):
    run = make_run(status=status)
    checkpoint_on_disk(run, 1)

    response = operator.post(f"/runs/{run.pk}/delete", follow=True)

    assert Run.objects.filter(pk=run.pk).exists() and run_directory(run.pk).exists()
    assert "only a finished run can be deleted (stop or cancel it first)" in \
        response.content.decode()


def test_delete_is_refused_while_a_fork_waits_to_start_from_its_checkpoint(operator, make_run):
    parent = make_run(status=RunStatus.STOPPED)
    fork = make_run(status=RunStatus.QUEUED, parent=parent)

    response = operator.post(f"/runs/{parent.pk}/delete", follow=True)

    assert Run.objects.filter(pk=parent.pk).exists()
    assert f"fork(s) #{fork.pk} will start from" in response.content.decode()


def test_a_viewer_can_neither_delete_nor_archive(viewer, make_run):
    run = make_run(status=RunStatus.STOPPED)

    assert viewer.post(f"/runs/{run.pk}/delete").status_code == 403
    assert viewer.post(f"/runs/{run.pk}/archive").status_code == 403
    assert Run.objects.filter(pk=run.pk, archived_at=None).exists()
    assert 'id="delete-form"' not in viewer.get(f"/runs/{run.pk}").content.decode()


def test_delete_takes_a_post_with_its_csrf_token(operator, make_run, django_user_model):
    run = make_run(status=RunStatus.STOPPED)
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(django_user_model.objects.get(username="operator"))

    assert operator.get(f"/runs/{run.pk}/delete").status_code == 405
    assert strict.post(f"/runs/{run.pk}/delete").status_code == 403
    assert Run.objects.filter(pk=run.pk).exists()
    page = operator.get(f"/runs/{run.pk}").content.decode()
    form = page[page.index('id="delete-form"'):]
    assert "csrfmiddlewaretoken" in form[:form.index("</form>")] and "confirm(" in form[:200]


# --- the run page header --------------------------------------------------------------------

def test_the_run_header_says_step_k_of_n_eta_rewards_and_open_alerts(viewer, make_run,
                                                                      monkeypatch):
    # The clock stands still: the page rounds "now - started_at" as it renders, and a busy
    # machine spends more than half a second on the writes and the GET below.
    now = timezone.now()
    monkeypatch.setattr(timezone, "now", lambda: now)
    run = make_run(started_at=now - timezone.timedelta(seconds=125))
    Run.objects.filter(pk=run.pk).update(config={**run.config, "steps": 10})
    do_ingest_events(run, [
        metrics(1, 1, **{"time/step_s": 2.0, "reward/mean": 0.1, "eval/reward_mean": 0.3}),
        metrics(2, 2, **{"time/step_s": 4.0, "reward/mean": 0.2}),
    ])
    Alert.objects.create(run=run, kind="BubbleHigh", dedup_key="a", cause="c", runbook="r")

    html = viewer.get(f"/runs/{run.pk}").content.decode()

    header = html[html.index('id="run-progress"'):]
    header = header[:header.index("</dl>")]
    # The engine's metrics name steps from 0: step 2's are the third step trained.
    assert '<span id="progress-step">3</span> of 10' in header
    assert '<dd id="progress-elapsed">2m 05s</dd>' in header
    assert '<dd id="progress-eta">21s</dd>' in header   # 7 steps left x 3 s mean
    assert '<dd id="progress-reward">0.200</dd>' in header
    assert "0.300 <small>(step 1)</small>" in header
    assert f'href="/alerts?run={run.pk}">1</a>' in header
    assert 'id="axis-switch"' in html


# --- the same over the REST API -------------------------------------------------------------

def test_the_rest_api_restores_and_deletes_a_finished_run_operators_only(
        client, make_run, django_capture_on_commit_callbacks):
    operator, viewer = (api_token("olga", operator=True), api_token("vic", operator=False))
    run = run_with_everything(make_run, "via-api")
    running = make_run(name="busy")

    def call(method, path, token):
        return getattr(client, method)(f"/api/v1{path}",
                                       headers={"Authorization": f"Bearer {token}"})

    assert call("post", f"/runs/{run.pk}/archive", operator).json()["archived"] is True
    assert call("post", f"/runs/{run.pk}/restore", viewer).status_code == 403
    assert call("post", f"/runs/{run.pk}/restore", operator).json()["archived"] is False
    assert call("delete", f"/runs/{run.pk}", viewer).status_code == 403
    refused = call("delete", f"/runs/{running.pk}", operator)
    assert refused.status_code == 409 and "only a finished run" in refused.json()["detail"]
    with django_capture_on_commit_callbacks(execute=True):
        assert call("delete", f"/runs/{run.pk}", operator).status_code == 204
    assert set(rows_of(run.pk).values()) == {0} and not run_directory(run.pk).exists()
    assert Run.objects.filter(pk=running.pk).exists()


def test_the_list_pages_its_runs_newest_first_with_a_link_to_older_ones(viewer):
    Run.objects.bulk_create(Run(name=f"run {i}", config={"name": "t", "steps": 3})
                            for i in range(205))
    newest = list(Run.objects.values_list("name", flat=True)[:200])

    first = viewer.get("/", {"status": RunStatus.QUEUED})
    older = viewer.get("/", {"status": RunStatus.QUEUED, "page": 2})

    assert [r.name for r in first.context["runs"]] == newest
    assert 'href="?status=queued&amp;page=2" id="older-runs"' in first.content.decode()
    assert len(older.context["runs"]) == 5 and older.context["older_url"] is None
    assert len(viewer.get("/", {"page": "x"}).context["runs"]) == 200
