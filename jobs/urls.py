from django.urls import path

from jobs import api, views

urlpatterns = [
    path("", views.index, name="index"),
    path("runs/<int:run_id>", views.run_detail, name="run-detail"),
    path("api/runs/<int:run_id>/events", api.ingest_events, name="ingest-events"),
]
