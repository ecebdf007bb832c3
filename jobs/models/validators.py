"""Config fields hold a complete RunConfig as JSON: validated and normalized on save."""

from typing import Any

from django.core.exceptions import ValidationError

from engine.config import ConfigError, validate_config


def normalized_config(data: Any) -> dict:
    """The config with every default filled in, or ValidationError naming each bad field."""
    if not isinstance(data, dict):
        raise ValidationError("the config must be a JSON object (a TOML table)")
    try:
        return validate_config(data).model_dump(mode="json")
    except ConfigError as exc:
        raise ValidationError([f"{path}: {message}" for path, message in exc.errors]) from None


def validate_run_config(data: Any) -> None:
    normalized_config(data)
