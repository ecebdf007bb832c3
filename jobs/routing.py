"""Websocket routes (controlplane.asgi mounts them behind auth and an origin check)."""

from django.urls import path

from jobs import consumers

websocket_urlpatterns = [
    path("ws/runs/", consumers.RunsConsumer.as_asgi()),
    path("ws/runs/<int:run_id>/", consumers.RunConsumer.as_asgi()),
]
