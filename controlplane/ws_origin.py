"""Websocket handshakes only from this site's own pages.

Channels' AllowedHostsOriginValidator compares the Origin's host with ALLOWED_HOSTS and
ignores its scheme and port, so a page served by any other local server
(http://localhost:9999) could open a socket with the operator's cookie. Here the Origin
must equal the origin the browser is talking to, taken from the handshake itself (the Host
header, and wss -> https, ws -> http; with RLPLANE_PROXY_TLS, uvicorn takes the scheme
from the proxy), or be one of CSRF_TRUSTED_ORIGINS, as Django's CSRF check does for forms.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings

DEFAULT_PORTS = {"http": 80, "https": 443}


def normalized(origin: str) -> str:
    """scheme://host[:port], lower-case, the default port dropped; "" when unparsable."""
    parts = urlsplit(origin.strip().lower())
    try:
        port = parts.port
    except ValueError:
        return ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if not host or parts.scheme not in DEFAULT_PORTS:
        return ""
    shown = f":{port}" if port and port != DEFAULT_PORTS[parts.scheme] else ""
    return f"{parts.scheme}://{host}{shown}"


class SameOriginValidator:
    def __init__(self, application):
        self.application = application

    async def __call__(self, scope, receive, send):
        if scope["type"] != "websocket" or self.allowed(scope):
            return await self.application(scope, receive, send)
        return await WebsocketDenier()(scope, receive, send)

    @staticmethod
    def allowed(scope) -> bool:
        headers = dict(scope.get("headers", []))
        origin = headers.get(b"origin", b"").decode("latin-1")
        host = headers.get(b"host", b"").decode("latin-1")
        if not origin or origin == "null":
            return False
        scheme = "https" if scope.get("scheme") in ("wss", "https") else "http"
        allowed = {normalized(o) for o in settings.CSRF_TRUSTED_ORIGINS}
        if host:
            allowed.add(normalized(f"{scheme}://{host}"))
        allowed.discard("")
        return normalized(origin) in allowed
