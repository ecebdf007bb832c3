from django.contrib import admin
from django.urls import include, path

from controlplane import health

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("", include("jobs.urls")),
]
