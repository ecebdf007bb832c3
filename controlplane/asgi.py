"""ASGI entry point (`uvicorn controlplane.asgi:application`): HTTP through Django, and
websockets through Channels, where the session cookie gives the consumers their user and
the Origin must be this site itself, scheme, host and port (controlplane.ws_origin): a page
elsewhere cannot use the cookie.
Request bodies are bounded before Django spools them (controlplane.body_limit).
"""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

# Django must be set up before anything imports models (the consumers do).
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from controlplane.body_limit import BodyLimit  # noqa: E402
from controlplane.ws_origin import SameOriginValidator  # noqa: E402
from jobs.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter({
    "http": BodyLimit(django_asgi_app),
    "websocket": SameOriginValidator(AllowedHostsOriginValidator(
        AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))),
})
