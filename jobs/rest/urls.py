from django.urls import path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from jobs.rest import runs, samples, views

urlpatterns = [
    path("runs", runs.runs, name="api-runs"),
    path("runs/external", runs.external_runs, name="api-runs-external"),
    path("runs/compare", runs.compare, name="api-runs-compare"),
    path("runs/<int:run_id>", runs.run, name="api-run"),
    path("runs/<int:run_id>/stop", runs.stop, name="api-run-stop"),
    path("runs/<int:run_id>/fork", runs.fork, name="api-run-fork"),
    path("runs/<int:run_id>/archive", runs.archive, name="api-run-archive"),
    path("runs/<int:run_id>/restore", runs.restore, name="api-run-restore"),
    path("runs/<int:run_id>/priority", runs.priority, name="api-run-priority"),
    path("runs/<int:run_id>/baseline", runs.baseline, name="api-run-baseline"),
    path("runs/<int:run_id>/metrics", runs.metrics, name="api-run-metrics"),
    path("runs/<int:run_id>/metric-names", runs.metric_names, name="api-run-metric-names"),
    path("runs/<int:run_id>/events", runs.events, name="api-run-events"),
    path("runs/<int:run_id>/job-log", runs.job_log, name="api-run-job-log"),
    path("runs/<int:run_id>/checkpoints", runs.checkpoints, name="api-run-checkpoints"),
    path("runs/<int:run_id>/controls", runs.controls, name="api-run-controls"),
    path("runs/<int:run_id>/samples", samples.samples, name="api-run-samples"),
    path("alerts", views.alerts, name="api-alerts"),
    path("alerts/<int:alert_id>/acknowledge", views.acknowledge, name="api-alert-ack"),
    path("alerts/<int:alert_id>/resolve", views.resolve, name="api-alert-resolve"),
    path("presets", views.presets, name="api-presets"),
    path("presets/<int:preset_id>", views.preset, name="api-preset"),
    path("cluster", views.cluster, name="api-cluster"),
    path("schema", SpectacularAPIView.as_view(), name="api-schema"),
    path("docs", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
]
