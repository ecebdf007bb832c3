"""The REST API over HTTP, and where `rlplane login` keeps the URL and token.

    <config dir>/credentials.json   {"url": ..., "token": ...}, mode 0600
    config dir: $RLPLANE_CONFIG_DIR, else $XDG_CONFIG_HOME/rlplane, else ~/.config/rlplane

Every failure is an ApiError carrying the exit code the CLI ends with (EXIT_* below), so a
script can tell "bad input" from "not allowed" from "server down" without parsing text.

A redirect is followed only within the control plane's origin (scheme, host, port): urllib
copies the Authorization header onto wherever a 30x points, so a redirect elsewhere is
refused rather than handing the token to another host.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from engine.telemetry.http_sink import CrossOriginRedirect, same_origin_opener

EXIT_OK = 0
EXIT_ERROR = 1          # anything else: the server failed (5xx), an unexpected answer
EXIT_USAGE = 2          # bad arguments or bad input: a config field, a request field (400)
EXIT_AUTH = 3           # not logged in, or the token is unknown or revoked (401)
EXIT_FORBIDDEN = 4      # the token's user lacks the role: viewers cannot change runs (403)
EXIT_NOT_FOUND = 5      # no such run, alert or checkpoint (404)
EXIT_CONFLICT = 6       # the run's state does not allow it: stop a finished run (409)
EXIT_UNREACHABLE = 7    # the control plane did not answer
EXIT_RUN_FAILED = 8     # `watch`: the run ended failed or lost

BY_STATUS = {400: EXIT_USAGE, 401: EXIT_AUTH, 403: EXIT_FORBIDDEN, 404: EXIT_NOT_FOUND,
             409: EXIT_CONFLICT}
TIMEOUT_S = 30.0


class ApiError(Exception):
    def __init__(self, message: str, exit_code: int, errors: list[dict] | None = None):
        super().__init__(message)
        self.exit_code = exit_code
        self.errors = errors or []


def config_dir() -> Path:
    if os.environ.get("RLPLANE_CONFIG_DIR"):
        return Path(os.environ["RLPLANE_CONFIG_DIR"])
    base = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(base) / "rlplane"


def credentials_path() -> Path:
    return config_dir() / "credentials.json"


def save_credentials(url: str, token: str) -> Path:
    path = credentials_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": url, "token": token}, f)
    os.chmod(path, 0o600)  # an older file keeps its mode through O_TRUNC
    return path


class Client:
    def __init__(self, url: str, token: str):
        self.url = url.rstrip("/")
        self.token = token
        self.opener = same_origin_opener()

    @classmethod
    def from_credentials(cls) -> Client:
        path = credentials_path()
        if not path.is_file():
            raise ApiError("not logged in: run `rlplane login URL` first", EXIT_AUTH)
        data = json.loads(path.read_text())
        return cls(data["url"], data["token"])

    def page_url(self, path: str) -> str:
        return self.url + path

    def request(self, method: str, path: str, body: dict | None = None,
                params: dict | list | None = None):
        url = f"{self.url}/api/v1{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params, doseq=True)
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Accept": "application/json",
            **({"Content-Type": "application/json"} if data is not None else {})})
        try:
            with self.opener.open(request, timeout=TIMEOUT_S) as response:
                return json.loads(response.read() or b"null")
        except CrossOriginRedirect as exc:
            raise ApiError(f"{url} redirected to another origin ({exc.msg}); not followed, so "
                           "your API token was not sent there. If the control plane moved, "
                           "log in at its new address: rlplane login URL", EXIT_ERROR) from None
        except urllib.error.HTTPError as exc:
            raise error_from(exc) from None
        except OSError as exc:
            raise ApiError(f"{self.url} did not answer: {exc}", EXIT_UNREACHABLE) from None

    def get(self, path: str, **params):
        return self.request("GET", path, params={k: v for k, v in params.items()
                                                 if v is not None})

    def post(self, path: str, body: dict | None = None):
        return self.request("POST", path, body or {})


def error_from(exc: urllib.error.HTTPError) -> ApiError:
    try:
        body = json.loads(exc.read())
    except ValueError:
        body = {}
    detail = body.get("detail") if isinstance(body, dict) else None
    return ApiError(detail or f"HTTP {exc.code} {exc.reason}",
                    BY_STATUS.get(exc.code, EXIT_ERROR),
                    body.get("errors") if isinstance(body, dict) else None)
