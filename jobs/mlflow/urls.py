"""Under /mlflow/: MLFLOW_TRACKING_URI=http://<rlplane>/mlflow."""

from django.urls import path
from django.views.generic import RedirectView

from jobs.mlflow import views

API = "api/2.0/mlflow/"

urlpatterns = [
    # The client prints links to its UI (/mlflow/#/experiments/...): the runs list.
    path("", RedirectView.as_view(pattern_name="index")),
    path(API + "experiments/get-by-name", views.get_experiment_by_name),
    path(API + "experiments/get", views.get_experiment),
    path(API + "experiments/create", views.create_experiment),
    path(API + "runs/create", views.create_run),
    path(API + "runs/get", views.get_run),
    path(API + "runs/update", views.update_run),
    path(API + "runs/log-batch", views.log_batch),
    path(API + "runs/log-metric", views.log_metric),
    path(API + "runs/log-parameter", views.log_param),
    path(API + "runs/set-tag", views.set_tag),
    path(API + "runs/log-inputs", views.accept_and_drop),
    path(API + "runs/log-model", views.accept_and_drop),
    path(API + "runs/outputs", views.accept_and_drop),
    path("api/2.0/mlflow-artifacts/artifacts/rlplane/runs/<str:run_id>/<path:name>",
         views.drop_artifact),
    path("<path:rest>", views.not_served),
]
