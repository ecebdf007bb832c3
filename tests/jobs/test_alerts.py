"""Alert rows: opened as events are ingested, deduplicated, resolved when the condition
clears, acknowledged / resolved by operators; the periodic task for rules that need a
clock; the pages and the run socket that show them."""

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from django.core.exceptions import ValidationError
from django.utils import timezone

from engine.api import WeightSyncEvent
from jobs.alerts import lifecycle
from jobs.alerts.tasks import evaluate_alerts
from jobs.ingest.store import do_ingest_events
from jobs.models import (
    Alert,
    AlertChannel,
    AlertState,
    Notification,
    Preset,
    RunControl,
    RunStatus,
)

from .helpers import metrics, span
from .sockets import open_socket

HTMX = {"HX-Request": "true"}


def sync(seq, step, rollout_fp=None, version_rollout=None):
    v = step + 1
    return WeightSyncEvent(
        seq=seq, ts=1000.0 + seq, step=step, transport="in_place", version_learner=v,
        version_rollout=v if version_rollout is None else version_rollout,
        fingerprint_learner=f"fp{v}", fingerprint_rollout=rollout_fp or f"fp{v}",
        matched=rollout_fp is None, latency_s=0.01, bytes=1)


@pytest.fixture
def announced(monkeypatch):
    """The notifications queued for delivery (the Celery seam), in order."""
    queued = []
    monkeypatch.setattr("jobs.alerts.delivery.deliver_notification.delay", queued.append)
    return queued


def desync(run, channel_layer):
    do_ingest_events(run, [sync(1, 0), sync(2, 1, rollout_fp="fp1")])
    return Alert.objects.get(run=run)


def test_a_desync_opens_one_alert_and_repeats_collapse_into_it(run, channel_layer):
    alert = desync(run, channel_layer)
    assert (alert.kind, alert.state, alert.step) == ("WeightSyncDesync", "open", 1)
    assert "not receiving new weights" in alert.cause and "weight_sync" in alert.runbook
    do_ingest_events(run, [sync(3, 2, rollout_fp="fp1"), sync(4, 3, rollout_fp="fp1")])
    alert.refresh_from_db()
    assert Alert.objects.filter(run=run).count() == 1
    assert alert.step == 1 and alert.evidence["values"]["version_learner"] == 4


def test_an_evaluation_that_finds_an_open_alert_as_it_was_writes_nothing(run, channel_layer):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from jobs.alerts.debounce import do_evaluate_run_alerts

    alert = desync(run, channel_layer)
    with CaptureQueriesContext(connection) as queries:
        do_evaluate_run_alerts(run.pk)                # nothing new since
    assert not [q for q in queries if Alert._meta.db_table in q["sql"]
                and q["sql"].startswith("UPDATE")]
    do_ingest_events(run, [sync(3, 2, rollout_fp="fp1")])   # new evidence: written
    assert Alert.objects.get(pk=alert.pk).evidence["values"]["version_learner"] == 3


def test_the_alert_resolves_itself_when_the_condition_clears(run, channel_layer):
    alert = desync(run, channel_layer)
    do_ingest_events(run, [sync(3, 2)])
    alert.refresh_from_db()
    assert alert.state == AlertState.RESOLVED and alert.resolved_by is None
    assert alert.resolved_reason == "the condition cleared"
    do_ingest_events(run, [sync(4, 3, rollout_fp="fp1")])      # it comes back: a new row
    assert Alert.objects.filter(run=run, state=AlertState.OPEN).count() == 1
    assert Alert.objects.filter(run=run).count() == 2


def test_each_state_change_queues_one_notification_per_enabled_channel(
        run, channel_layer, announced, django_capture_on_commit_callbacks):
    hook = AlertChannel.objects.create(name="hook", kind="webhook", target="http://x/")
    AlertChannel.objects.create(name="off", kind="email", target="a@b.c", enabled=False)
    with django_capture_on_commit_callbacks(execute=True):
        alert = desync(run, channel_layer)
        do_ingest_events(run, [sync(3, 2, rollout_fp="fp1")])       # a repeat: no notice
        do_ingest_events(run, [sync(4, 3)])                         # cleared
    notices = Notification.objects.filter(alert=alert).order_by("id")
    assert [(n.channel, n.event) for n in notices] == [(hook, "open"), (hook, "resolved")]
    assert announced == [n.pk for n in notices]


def test_an_operator_acknowledges_then_resolves(run, channel_layer, operator):
    alert = desync(run, channel_layer)
    page = operator.get(f"/runs/{run.pk}").content.decode()
    assert f'id="alert-{alert.pk}"' in page and "Acknowledge" in page
    response = operator.post(f"/alerts/{alert.pk}/ack", headers=HTMX)
    assert response.status_code == 200 and 'data-state="acknowledged"' in response.content.decode()
    alert.refresh_from_db()
    assert alert.state == AlertState.ACKNOWLEDGED and alert.acknowledged_by.username == "operator"
    operator.post(f"/alerts/{alert.pk}/resolve")
    alert.refresh_from_db()
    assert alert.state == AlertState.RESOLVED and alert.resolved_reason == "resolved by operator"
    assert not alert.acknowledge(None)                               # resolved is final


def test_a_viewer_cannot_acknowledge(run, channel_layer, client, django_user_model):
    alert = desync(run, channel_layer)
    client.force_login(django_user_model.objects.create_user("viewer"))
    assert client.post(f"/alerts/{alert.pk}/ack").status_code == 403
    assert "Acknowledge" not in client.get(f"/runs/{run.pk}").content.decode()
    alert.refresh_from_db()
    assert alert.state == AlertState.OPEN


def test_the_alerts_page_filters_by_state_and_kind(make_run, channel_layer, operator):
    first, second = make_run(), make_run()
    desync(first, channel_layer)
    do_ingest_events(second, [metrics(1, 0, **{"staleness/max": 3.0})])
    page = operator.get("/alerts").content.decode()
    assert "WeightSyncDesync" in page and "StalenessOverBound" in page
    only = operator.get("/alerts?kind=StalenessOverBound", headers=HTMX).content.decode()
    assert "StalenessOverBound" in only and 'data-kind="WeightSyncDesync"' not in only
    assert "No alerts match" in operator.get("/alerts?state=resolved").content.decode()


def test_the_evidence_shows_values_and_a_small_chart_and_links_the_step(
        run, channel_layer, operator):
    do_ingest_events(run, [metrics(i + 1, i, **{"staleness/max": float(i)}) for i in range(3)])
    page = operator.get(f"/runs/{run.pk}").content.decode()
    assert "<polyline" in page and "staleness/max (steps 0-2" in page
    assert f"/runs/{run.pk}?step=2#charts" in page   # evaluated once, at the batch


def test_thresholds_come_from_the_preset_of_the_same_name(run, channel_layer):
    Preset.objects.create(name=run.config["name"], config=run.config,
                          alert_thresholds={"desync_version_lag": 10})
    do_ingest_events(run, [sync(1, 5, version_rollout=1)])         # 5 behind
    assert not Alert.objects.filter(run=run).exists()
    with pytest.raises(ValidationError, match="desync_version_lag"):
        Preset(name="x", config={}, alert_thresholds={"desync_version_lag": -1}).full_clean()
    with pytest.raises(ValidationError, match="no_such"):
        Preset(name="y", config={}, alert_thresholds={"no_such": 1}).full_clean()


def test_the_periodic_task_catches_a_hang_that_no_event_reports(run, channel_layer):
    Preset.objects.create(name=run.config["name"], config=run.config,
                          alert_thresholds={"hang_min_s": 1.0})
    events = []
    for step in range(3):
        events += [span(len(events) + 1, step, phase=p) for p in ("rollout", "learner")]
        events.append(metrics(len(events) + 1, step, **{"reward/mean": 0.1}))
    do_ingest_events(run, events)       # their timestamps are long past: stuck since then
    evaluate_alerts()
    alert = Alert.objects.get(run=run, kind="PhaseHang")
    assert alert.cause.startswith("Stuck in ") and "cpu:0" in alert.cause


def test_a_paused_run_is_not_a_hang_and_a_resumed_one_can_be(run, channel_layer):
    Preset.objects.create(name=run.config["name"], config=run.config,
                          alert_thresholds={"hang_min_s": 1.0})
    events = []
    for step in range(3):
        events += [span(len(events) + 1, step, phase=p) for p in ("rollout", "learner")]
        events.append(metrics(len(events) + 1, step, **{"reward/mean": 0.1}))
    pause = RunControl.objects.create(run=run, kind="pause")
    RunControl.objects.filter(pk=pause.pk).update(applied_step=3, applied_at=timezone.now())
    do_ingest_events(run, events)       # long past, but the driver holds on purpose

    evaluate_alerts()
    assert not Alert.objects.filter(run=run, kind="PhaseHang").exists()

    resume = RunControl.objects.create(run=run, kind="resume")
    RunControl.objects.filter(pk=resume.pk).update(applied_step=3, applied_at=timezone.now())
    evaluate_alerts()
    assert Alert.objects.filter(run=run, kind="PhaseHang").exists()


def test_the_periodic_task_raises_run_lost(run, channel_layer):
    run.transition_to(RunStatus.LOST, "Ray has no job")
    evaluate_alerts()
    assert Alert.objects.get(run=run).kind == "RunLost"


@pytest.mark.django_db(transaction=True)
def test_the_run_socket_sends_alerts_after_backfill_and_when_they_change(
        run, channel_layer, session_cookie):
    first = desync(run, channel_layer)

    ingest = database_sync_to_async(do_ingest_events)

    async def scenario():
        communicator, _, _ = await open_socket(f"/ws/runs/{run.pk}/", session_cookie)
        await communicator.send_json_to({"last_seq": 2})
        initial = await communicator.receive_json_from(timeout=20)
        await ingest(run, [metrics(3, 2, **{"staleness/max": 4.0})])
        live = await communicator.receive_json_from(timeout=20)
        while "alerts" not in live:                  # the events' own message comes too
            live = await communicator.receive_json_from(timeout=20)
        await communicator.disconnect()
        return initial, live

    initial, live = async_to_sync(scenario)()
    assert list(initial["alerts"]) == [f"alert-{first.pk}"]
    assert "Acknowledge" not in initial["alerts"][f"alert-{first.pk}"]     # a viewer
    [html] = live["alerts"].values()
    assert "StalenessOverBound" in html


def test_lifecycle_dedups_findings_with_the_same_key_in_one_evaluation(run):
    from jobs.alerts.history import Finding

    f = Finding(kind="K", key="K", cause="c", runbook="r", step=1)
    lifecycle.do_apply_findings(run, [f, f])
    assert Alert.objects.filter(run=run).count() == 1


def test_a_run_that_ends_closes_its_alerts_and_a_lost_one_keeps_them(make_run):
    from jobs.alerts.history import Finding

    f = Finding(kind="K", key="K", cause="c", runbook="r", step=1)
    ended, lost = make_run(RunStatus.SUCCEEDED), make_run(RunStatus.LOST)
    lifecycle.do_apply_findings(ended, [f])
    lifecycle.do_apply_findings(lost, [f])

    alert = Alert.objects.get(run=ended)
    assert alert.state == AlertState.RESOLVED and "the run ended" in alert.resolved_reason
    assert Alert.objects.get(run=lost).state == AlertState.OPEN


def test_an_operator_edits_a_presets_thresholds_and_bad_values_name_the_field(operator):
    preset = Preset.objects.create(name="demo", config={"name": "demo"})
    page = operator.get(f"/presets/{preset.pk}/alerts").content.decode()
    assert "hang_min_s" in page and "PhaseHang never fires before" in page
    response = operator.post(f"/presets/{preset.pk}/alerts",
                             {"hang_min_s": "5", "gap_high": "0.1"})
    assert response.status_code == 302
    preset.refresh_from_db()
    assert preset.alert_thresholds == {"hang_min_s": 5.0}        # only what differs
    bad = operator.post(f"/presets/{preset.pk}/alerts", {"bubble_max": "7"}).content.decode()
    assert "less than or equal to 1" in bad
    preset.refresh_from_db()
    assert preset.alert_thresholds == {"hang_min_s": 5.0}


def test_a_viewer_cannot_edit_thresholds(client, django_user_model):
    preset = Preset.objects.create(name="demo", config={"name": "demo"})
    client.force_login(django_user_model.objects.create_user("viewer"))
    assert client.post(f"/presets/{preset.pk}/alerts", {"hang_min_s": "5"}).status_code == 403


def test_a_failing_evaluation_does_not_cost_the_events(run, monkeypatch):
    def broken(*args):
        raise RuntimeError("a rule bug")

    monkeypatch.setattr("jobs.alerts.lifecycle.evaluate", broken)
    result = do_ingest_events(run, [sync(1, 0), sync(2, 1, rollout_fp="fp1")])
    assert result.stored == 2 and not Alert.objects.exists()
