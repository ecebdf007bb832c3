"""All outgoing HTTP of the control plane's alerting goes through here (tests patch one seam).

    post_json(url, payload, timeout_s) -> status code; raises HttpError on no answer
    check_target(url)                  -> None, or TargetRefused saying why and the fix

A webhook target is typed by an operator but answered by whatever it names, so the
control plane will not be made to POST into its own network (server-side request
forgery), as GitLab and Grafana refuse local targets by default:

    scheme         http or https only (no file://, gopher://, schemeless)
    addresses      every address the host resolves to must be public (is_global); a
                   loopback, private, link-local or reserved one is refused unless its
                   host or network is in RLPLANE_WEBHOOK_ALLOW
    deny           RLPLANE_WEBHOOK_DENY (hosts or networks) wins over everything
    redirects      never followed: a 3xx is the receiver's answer, reported as a failure

The check runs when the channel is saved (scheme and host) and again before each send
(the addresses: DNS can change in between). The name is resolved again by the request
itself, so a host that answers differently within those milliseconds (DNS rebinding) is
not covered; put webhooks behind an egress proxy where that matters.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from django.conf import settings


class HttpError(Exception):
    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class TargetRefused(HttpError):
    """The target breaks the policy (module docstring); retrying cannot help."""


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None               # urllib then raises HTTPError with the 3xx status


_OPENER = urllib.request.build_opener(_NoRedirects, urllib.request.ProxyHandler({}))


def _listed(host: str, addresses: list, entries: list[str]) -> bool:
    for entry in entries:
        try:
            net = ipaddress.ip_network(entry, strict=False)
        except ValueError:
            if host.lower() == entry.lower():
                return True
            continue
        if any(a in net for a in addresses):
            return True
    return False


def check_syntax(url: str) -> tuple[str, int]:
    """(host, port) of an http(s) URL, or TargetRefused."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise TargetRefused(f"{url!r}: a webhook target must be an http:// or https:// URL")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise TargetRefused(f"{url!r}: the port is not a number in 1-65535") from None
    if not parts.hostname:
        raise TargetRefused(f"{url!r}: the URL names no host")
    return parts.hostname, port


def check_target(url: str) -> None:
    host, port = check_syntax(url)
    allow, deny = settings.RLPLANE_WEBHOOK_ALLOW, settings.RLPLANE_WEBHOOK_DENY
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise HttpError(f"{url}: {host} does not resolve ({exc})") from None
    addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]
    if _listed(host, addresses, deny):
        raise TargetRefused(f"{url}: {host} is in RLPLANE_WEBHOOK_DENY")
    if _listed(host, addresses, allow):
        return
    for address in addresses:
        if not address.is_global:
            raise TargetRefused(
                f"{url}: {host} resolves to {address}, a non-public address; webhooks go "
                f"to public hosts unless RLPLANE_WEBHOOK_ALLOW names it (e.g. {host})")


def post_json(url: str, payload: dict, timeout_s: float = 10.0) -> int:
    """POST ``payload`` as JSON; the response's status code (3xx/4xx/5xx included)."""
    check_target(url)
    body = json.dumps(payload).encode()
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", "User-Agent": "rlplane-alerts"})
    try:
        with _OPENER.open(request, timeout=timeout_s) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise HttpError(f"{url}: {getattr(exc, 'reason', exc)}") from None
