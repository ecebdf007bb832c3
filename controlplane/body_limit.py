"""An ASGI guard in front of Django: request bodies are bounded before anything reads them.

Django's ASGI handler spools a whole body into a temporary file before any view (and so
before any authentication) runs, and DATA_UPLOAD_MAX_MEMORY_SIZE is only checked after
that. A client holding nothing could make the server write gigabytes. Here:

    Content-Length over the limit        413 at once, the body unread
    a body that streams past the limit   the request is cut off (Django sees a disconnect)
    POST to the engine's ingest without  401 at once, the body unread (a run token is
      an Authorization header              the only way in there)

The limit is DATA_UPLOAD_MAX_MEMORY_SIZE: no form or API body here needs more, and an
ingest batch over it is split by the engine's HTTP sink on the 413.
"""

from __future__ import annotations

import json
import re

from django.conf import settings

INGEST_PATH = re.compile(r"^/api/runs/[^/]+/events/?$")


async def _answer(send, status: int, message: str, headers: list | None = None,
                  path: str = "") -> None:
    # The REST API's error shape under /api/v1/ ({"detail"}), the engine's elsewhere.
    key = "detail" if path.startswith("/api/v1/") else "error"
    body = json.dumps({key: message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if scope["type"] != "http" or limit is None:
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        length = headers.get(b"content-length")
        if length is not None and (not length.strip().isdigit() or int(length) > limit):
            return await _answer(send, 413, f"the request body is over {limit} bytes; "
                                            "send less per request", path=scope["path"])
        if (scope["method"] == "POST" and INGEST_PATH.match(scope["path"])
                and b"authorization" not in headers):
            return await _answer(send, 401, "send the run's ingest token as "
                                            "'Authorization: Bearer <token>'",
                                 [(b"www-authenticate", b"Bearer")])
        seen = 0

        async def bounded_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    return {"type": "http.disconnect"}
            return message

        return await self.app(scope, bounded_receive, send)
