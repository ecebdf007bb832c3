"""GET /metrics: the Prometheus exposition format (prometheus-client), for a scrape that
sends ``Authorization: Bearer $RLPLANE_METRICS_TOKEN``. Unset, the endpoint answers 403.

    rlplane_run_metric{run, run_name, framework, name}
                                                each live run's latest value of every metric
                                                it reports under a canonical name
                                                (engine/metrics.py: "reward/mean", "bubble",
                                                ...) or one of RLPLANE_PROMETHEUS_EXTRA_METRICS
                                                (framework: "rlplane", "trl", "verl", ...)
    rlplane_run_step{run, run_name, framework}  the step those values come from
    rlplane_runs{status}                        runs by status
    rlplane_queue_length                        queued runs (jobs/runs/queue.py)
    rlplane_alerts{kind, state}                 alert rows by rule and state
    rlplane_ingest_events_total{outcome}        stored | duplicate |     } counted in this
                                                over_name_cap            }
    rlplane_ingest_batches_total{code}          HTTP status of the batch } process, since
    rlplane_ingest_seconds                      histogram of a batch     } it started

The run, alert and queue families are read from the database at scrape time (a custom
collector), so every web process answers the same; the ingest families are per process
(the embedded stack runs one uvicorn worker). Every series a dashboard or an alert rule
sums reads 0 rather than vanishing when nothing is there (each run status, each alert rule
and state, each ingest outcome), and no ``_created`` series doubles the counters.
"""

from __future__ import annotations

import hmac

from django.conf import settings
from django.db.models import Count
from django.http import HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
)
from prometheus_client import generate_latest as exposition
from prometheus_client.core import GaugeMetricFamily

from engine.api import metrics as M
from jobs.alerts.rules import KINDS
from jobs.auth import bearer_token
from jobs.models import LIVE, Alert, AlertState, Run, RunStatus, latest_values

# A counter's _created timestamp is one more series per label set, which no dashboard here
# reads (process-wide: this is the process's only registry).
disable_created_metrics()
REGISTRY = CollectorRegistry(auto_describe=True)
INGEST_EVENTS = Counter("rlplane_ingest_events", "Events received by ingest, by outcome.",
                        ["outcome"], registry=REGISTRY)
INGEST_BATCHES = Counter("rlplane_ingest_batches", "Ingest requests, by HTTP status.",
                         ["code"], registry=REGISTRY)
INGEST_SECONDS = Histogram("rlplane_ingest_seconds", "Time to store one ingest batch.",
                           registry=REGISTRY,
                           buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
for outcome in ("stored", "duplicate"):
    INGEST_EVENTS.labels(outcome)   # 0 from the start, not absent until the first event


def exported(name: str) -> bool:
    """Only the canonical names (engine/metrics.py, families included) and the configured
    RLPLANE_PROMETHEUS_EXTRA_METRICS are exported: a run token names its metrics, and
    each name would be a series in every scrape."""
    return (name in M.METRICS or name in settings.RLPLANE_PROMETHEUS_EXTRA_METRICS
            or any(family.match(name) for family in M.FAMILIES))


class DatabaseCollector:
    """The run, alert and queue families, read at scrape time."""

    def describe(self):
        return []  # no query at registration (the database may not exist yet)

    def collect(self):
        runs = {r.pk: r for r in Run.objects.filter(status__in=LIVE)
                .only("id", "name", "config")}
        values = GaugeMetricFamily("rlplane_run_metric", "A live run's latest value of a "
                                   "metric (names: engine/metrics.py).",
                                   labels=["run", "run_name", "framework", "name"])
        steps = GaugeMetricFamily("rlplane_run_step", "The step of a live run's latest "
                                  "metrics.", labels=["run", "run_name", "framework"])
        for run_id, latest in latest_values(runs).items():
            run = runs[run_id]
            for name, (_, value) in sorted(latest.items()):
                if value is not None and exported(name):  # NaN/inf are stored as NULL
                    values.add_metric([str(run_id), run.name, run.framework, name], value)
            steps.add_metric([str(run_id), run.name, run.framework],
                             max(step for step, _ in latest.values()))
        yield values
        yield steps
        by_status = GaugeMetricFamily("rlplane_runs", "Runs by status.", labels=["status"])
        counts = dict(Run.objects.values_list("status").annotate(n=Count("id")).order_by())
        for status in RunStatus.values:
            by_status.add_metric([status], counts.get(status, 0))
        yield by_status
        yield GaugeMetricFamily("rlplane_queue_length", "Runs waiting in the queue.",
                                value=counts.get(RunStatus.QUEUED, 0))
        alerts = GaugeMetricFamily("rlplane_alerts", "Alerts by rule and state.",
                                   labels=["kind", "state"])
        counted = {(kind, state): n for kind, state, n in Alert.objects.values_list(
            "kind", "state").annotate(n=Count("id")).order_by()}
        for kind in sorted(set(KINDS) | {kind for kind, _ in counted}):
            for state in AlertState.values:
                alerts.add_metric([kind, state], counted.get((kind, state), 0))
        yield alerts


REGISTRY.register(DatabaseCollector())


def scrape_allowed(request) -> bool:
    expected = settings.RLPLANE_METRICS_TOKEN
    token = bearer_token(request)
    # compare_digest takes str only when ASCII (it raises TypeError on "é"): compare bytes
    return bool(expected and token and hmac.compare_digest(token.encode(), expected.encode()))


@require_GET
def metrics(request):
    if not scrape_allowed(request):
        return HttpResponse("send RLPLANE_METRICS_TOKEN as 'Authorization: Bearer <token>' "
                            "(unset: /metrics is off)\n", status=403, content_type="text/plain")
    return HttpResponse(exposition(REGISTRY), content_type=CONTENT_TYPE_LATEST)
