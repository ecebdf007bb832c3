"""Config fields hold a complete RunConfig as JSON: validated and normalized on save; alert
threshold overrides are checked against jobs.alerts.history.Thresholds."""

from typing import Any

from django.core.exceptions import ValidationError

from engine.config import ConfigError, is_external, validate_config, validate_external


def normalized_config(data: Any) -> dict:
    """The config with every default filled in, or ValidationError naming each bad field:
    a RunConfig, or an external run's config (one with a ``framework`` key)."""
    if not isinstance(data, dict):
        raise ValidationError("the config must be a JSON object (a TOML table)")
    try:
        if is_external(data):
            return validate_external(data).model_dump(mode="json")
        return validate_config(data, check_files=False).model_dump(mode="json")
    except ConfigError as exc:
        raise ValidationError([f"{path}: {message}" for path, message in exc.errors]) from None


def validate_run_config(data: Any) -> None:
    normalized_config(data)


def validate_alert_thresholds(data: Any) -> None:
    """Overrides of the alert thresholds: known names, values within their bounds."""
    from pydantic import ValidationError as PydanticError

    from jobs.alerts.history import Thresholds

    if not isinstance(data, dict):
        raise ValidationError("alert thresholds must be a JSON object of name -> value")
    try:
        Thresholds(**data)
    except PydanticError as exc:
        raise ValidationError([f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
                               for e in exc.errors()]) from None


def parse_pk(text: str) -> int | None:
    """A primary key from a query string, or None: ASCII digits only ("²".isdigit() is
    True and int("²") raises) and within a 64-bit column (a longer one overflows it)."""
    if text.isascii() and text.isdigit() and len(text) <= 18:
        return int(text)
    return None
