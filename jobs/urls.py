from django.urls import path

from jobs import prometheus, views
from jobs.alerts import views as alerts
from jobs.alerts.lifecycle import do_acknowledge, do_resolve
from jobs.alerts.thresholds import preset_thresholds
from jobs.ingest import endpoints as ingest
from jobs.rest import runs as rest_runs
from jobs.views import cluster, compare, external, inspector, launch, runs_list, tokens

urlpatterns = [
    path("", views.index, name="index"),
    path("runs/<int:run_id>", views.run_detail, name="run-detail"),
    path("runs/compare", compare.compare_page, name="compare"),
    path("api/runs/compare", rest_runs.compare_for_pages, name="compare-api"),
    path("runs/<int:run_id>/samples", inspector.run_samples, name="run-samples"),
    path("api/runs/<int:run_id>/events", ingest.ingest_events, name="ingest-events"),
    path("api/runs/<int:run_id>/controls", ingest.control_poll, name="control-poll"),
    path("runs/<int:run_id>/controls", launch.run_control, name="run-control"),
    path("runs/new", launch.run_new, name="run-new"),
    path("runs/new/external", external.run_new_external, name="run-new-external"),
    path("runs/<int:run_id>/stop", launch.run_stop, name="run-stop"),
    path("runs/<int:run_id>/fork", launch.run_fork, name="run-fork"),
    path("runs/<int:run_id>/archive", runs_list.run_archive, name="run-archive"),
    path("runs/<int:run_id>/restore", runs_list.run_restore, name="run-restore"),
    path("runs/<int:run_id>/delete", runs_list.run_delete, name="run-delete"),
    path("cluster", cluster.cluster_page, name="cluster"),
    path("alerts", alerts.alerts_page, name="alerts"),
    path("alerts/<int:alert_id>/ack", alerts.alert_change, {"change": do_acknowledge},
         name="alert-ack"),
    path("alerts/<int:alert_id>/resolve", alerts.alert_change, {"change": do_resolve},
         name="alert-resolve"),
    path("presets/<int:preset_id>/alerts", preset_thresholds, name="preset-thresholds"),
    path("runs/<int:run_id>/priority", launch.run_priority, name="run-priority"),
    path("runs/<int:run_id>/baseline", launch.run_baseline, name="run-baseline"),
    path("settings/tokens", tokens.tokens_page, name="tokens"),
    path("settings/tokens/<int:token_id>/revoke", tokens.token_revoke, name="token-revoke"),
    path("metrics", prometheus.metrics, name="metrics"),
]
