from django.urls import include, path

from controlplane import health

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("", include("jobs.urls")),
]
