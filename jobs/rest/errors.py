"""Every API error is JSON: {"detail": "...", "errors": [{"field": path, "message": ...}]}.

A run config's errors carry the engine's (field path, message) pairs, the same messages
the run form shows; a request field's errors carry its name. A state the action does not
allow (InvalidTransition, Refused) is 409 with the same sentence the pages flash.
"""

from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from engine.api import ControlError
from engine.config import ConfigError
from jobs.models import InvalidTransition, NotNative
from jobs.runs.actions import Refused


def flatten(detail, path: str = "") -> list[dict]:
    """DRF's nested error detail -> [{"field": "a.b", "message": ...}]."""
    if isinstance(detail, dict):
        return [e for key, value in detail.items()
                for e in flatten(value, f"{path}.{key}" if path else str(key))]
    if isinstance(detail, list):
        return [e for item in detail for e in flatten(item, path)]
    return [{"field": path or "(request)", "message": str(detail)}]


def config_errors(exc: ConfigError, prefix: str = "") -> list[dict]:
    return [{"field": f"{prefix}{path}", "message": message} for path, message in exc.errors]


def exception_handler(exc, context):
    if isinstance(exc, ConfigError):
        return Response({"detail": "invalid run config", "errors": config_errors(exc)},
                        status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, ControlError):
        return Response({"detail": "invalid control",
                         "errors": [{"field": f, "message": m} for f, m in exc.errors]},
                        status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, ValidationError):
        return Response({"detail": "invalid request", "errors": flatten(exc.detail)},
                        status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, InvalidTransition | Refused | NotNative):
        return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
    return drf_exception_handler(exc, context)
