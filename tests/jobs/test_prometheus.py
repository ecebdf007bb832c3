"""GET /metrics: Prometheus's text format, parsed back with prometheus-client's own
parser; only a scrape with RLPLANE_METRICS_TOKEN gets it."""

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobs.models import Alert, AlertState, MetricPoint, RunStatus

from .helpers import metrics, post_events

pytestmark = pytest.mark.django_db

TOKEN = "scrape-secret"


def scrape(client, token=TOKEN):
    return client.get("/metrics", headers={"Authorization": f"Bearer {token}"})


def samples(response) -> dict[str, list]:
    families = text_string_to_metric_families(response.content.decode())
    return {f.name: f.samples for f in families}


@pytest.fixture
def scrape_token(settings):
    settings.RLPLANE_METRICS_TOKEN = TOKEN


def test_without_the_token_the_scrape_is_refused(client, settings):
    settings.RLPLANE_METRICS_TOKEN = ""
    assert scrape(client, "anything").status_code == 403
    settings.RLPLANE_METRICS_TOKEN = TOKEN
    assert scrape(client, "wrong").status_code == 403
    assert client.get("/metrics").status_code == 403


def test_a_live_run_exports_its_latest_metrics_and_a_finished_one_does_not(
        client, scrape_token, make_run):
    run, done = make_run(name="live"), make_run(RunStatus.SUCCEEDED, name="done")
    MetricPoint.objects.bulk_create(
        [MetricPoint(run=run, step=s, name="reward/mean", value=s / 10) for s in range(3)]
        + [MetricPoint(run=run, step=2, name="bubble", value=0.25),
           MetricPoint(run=done, step=9, name="reward/mean", value=1.0)])

    got = samples(scrape(client))

    values = {(s.labels["run"], s.labels["name"]): s.value for s in got["rlplane_run_metric"]}
    assert values == {(str(run.pk), "reward/mean"): 0.2, (str(run.pk), "bubble"): 0.25}
    assert [s.value for s in got["rlplane_run_step"]] == [2]
    assert {s.labels["run_name"] for s in got["rlplane_run_metric"]} == {"live"}


def test_alerts_queue_and_runs_are_counted(client, scrape_token, make_run):
    run = make_run()
    make_run(RunStatus.QUEUED)
    Alert.objects.create(run=run, kind="BubbleHigh", dedup_key="a", cause="c", runbook="r")
    Alert.objects.create(run=run, kind="BubbleHigh", dedup_key="b", cause="c", runbook="r",
                         state=AlertState.RESOLVED)

    got = samples(scrape(client))

    alerts = {(s.labels["kind"], s.labels["state"]): s.value for s in got["rlplane_alerts"]}
    assert alerts[("BubbleHigh", "open")] == 1 and alerts[("BubbleHigh", "resolved")] == 1
    # Every rule and state reads 0 rather than vanishing: a sum over them stays defined.
    assert alerts[("BubbleHigh", "acknowledged")] == 0 and alerts[("StuckReward", "open")] == 0
    assert got["rlplane_queue_length"][0].value == 1
    by_status = {s.labels["status"]: s.value for s in got["rlplane_runs"]}
    assert by_status["running"] == 1 and by_status["queued"] == 1


def test_no_created_series_and_ingest_outcomes_read_zero_before_any_event(
        client, scrape_token):
    text = scrape(client).content.decode()
    assert "_created" not in text
    assert 'rlplane_ingest_events_total{outcome="duplicate"}' in text


def test_ingest_is_counted_and_timed(client, scrape_token, run, token):
    def counters():
        got = samples(scrape(client))
        events = {s.labels["outcome"]: s.value for s in got["rlplane_ingest_events"]
                  if s.name == "rlplane_ingest_events_total"}
        count = next(s.value for s in got["rlplane_ingest_seconds"]
                     if s.name == "rlplane_ingest_seconds_count")
        return events.get("stored", 0), events.get("duplicate", 0), count

    before = counters()
    post_events(client, run, token, [metrics(1, 0, bubble=0.5), metrics(2, 1, bubble=0.4)])
    post_events(client, run, token, [metrics(2, 1, bubble=0.4)])  # a replay
    after = counters()

    assert (after[0] - before[0], after[1] - before[1], after[2] - before[2]) == (2, 1, 2)


def test_only_canonical_and_configured_names_are_exported(client, scrape_token, make_run,
                                                          settings):
    settings.RLPLANE_PROMETHEUS_EXTRA_METRICS = ["train/kl"]
    run = make_run(name="live")
    MetricPoint.objects.bulk_create(
        [MetricPoint(run=run, step=1, name=name, value=1.0)
         for name in ("reward/mean", "train/kl", "made/up/0", "made/up/1")])

    exported = {s.labels["name"] for s in samples(scrape(client))["rlplane_run_metric"]}

    assert exported == {"reward/mean", "train/kl"}
