"""All outgoing HTTP of the control plane's alerting goes through here (tests patch one seam).

    post_json(url, payload, timeout_s) -> status code; raises HttpError on no answer
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request


class HttpError(Exception):
    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def post_json(url: str, payload: dict, timeout_s: float = 10.0) -> int:
    """POST ``payload`` as JSON; the response's status code (4xx/5xx included)."""
    body = json.dumps(payload).encode()
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", "User-Agent": "rlplane-alerts"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        raise HttpError(f"{url}: {getattr(exc, 'reason', exc)}") from None
