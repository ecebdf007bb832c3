from django.urls import path

from jobs import api, views

urlpatterns = [
    path("", views.index, name="index"),
    path("api/runs/<int:run_id>/events", api.ingest_events, name="ingest-events"),
]
