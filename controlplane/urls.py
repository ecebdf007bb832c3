from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.templatetags.static import static
from django.urls import include, path
from django.views.generic import RedirectView

from controlplane import health

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    # What a browser asks for on a page that names no icon (the API docs, a JSON answer).
    path("favicon.ico", RedirectView.as_view(url=static("favicon.svg"), permanent=True)),
    path("admin/", admin.site.urls),
    path("login", auth_views.LoginView.as_view(), name="login"),
    path("logout", auth_views.LogoutView.as_view(), name="logout"),  # POST only
    path("api/v1/", include("jobs.rest.urls")),
    path("mlflow/", include("jobs.mlflow.urls")),
    path("", include("jobs.urls")),
]
