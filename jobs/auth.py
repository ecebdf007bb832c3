"""Two roles: viewers read everything; operators also launch, stop and fork runs.

An operator is a user in the "operator" group (or a superuser). Every page and websocket
requires login; the ingest endpoint instead takes the run's own bearer token.
"""

from __future__ import annotations

from functools import wraps

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied

OPERATOR_GROUP = "operator"


def bearer_token(request) -> str | None:
    """The token of an 'Authorization: Bearer <token>' header, or None."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def is_operator(user) -> bool:
    return bool(user.is_authenticated and (
        user.is_superuser or user.groups.filter(name=OPERATOR_GROUP).exists()))


def operator_required(view):
    """login_required, then 403 unless the user is an operator."""

    @login_required
    @wraps(view)
    def wrapped(request, *args, **kwargs):
        if not is_operator(request.user):
            raise PermissionDenied("operators only: ask an admin to add you to 'operator'")
        return view(request, *args, **kwargs)

    return wrapped
