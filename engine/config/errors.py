"""ConfigError (one field path and fix per problem) and reading, validating and writing
run configs as TOML."""

from __future__ import annotations

import tomllib
import typing
from pathlib import Path
from typing import Any

import tomli_w
from pydantic import BaseModel, ValidationError

from engine.config._base import _UNION_TAGS, FieldError
from engine.config.run import RunConfig

# --------------------------------------------------------------------------- errors

class ConfigError(ValueError):
    """A config that does not validate. ``errors`` holds one (field_path, message) per
    problem; ``str()`` lists them one per line, each naming the field and the fix."""

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = errors
        super().__init__("invalid run config:\n" + "\n".join(f"  {p}: {m}" for p, m in errors))


def _sections_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _sections_in(arg)]


def union_choices(section: str) -> list[str]:
    """The ``type`` values RunConfig accepts for a pluggable section, in union order."""
    return [m.model_fields["type"].default
            for m in _sections_in(RunConfig.model_fields[section].annotation)]


def _model_at(path: tuple[Any, ...], data: Any) -> type[BaseModel] | None:
    """The section that owns the field at ``path`` (for 'allowed keys' hints)."""
    model: type[BaseModel] = RunConfig
    node = data
    for key in path[:-1]:
        if isinstance(key, int) or key not in model.model_fields:
            return None
        node = node.get(key) if isinstance(node, dict) else None
        choices = _sections_in(model.model_fields[key].annotation)
        if not choices:
            return None
        tag = node.get("type") if isinstance(node, dict) else None
        model = next((c for c in choices if tag is not None
                      and c.model_fields.get("type") and c.model_fields["type"].default == tag),
                     choices[0])
    return model


def _format_error(err: dict[str, Any], data: Any) -> tuple[str, str]:
    # pydantic puts the chosen tag after a union's field; a top-level key is never a tag
    # (the weight-sync tag "checkpoint" is also the name of a RunConfig section)
    loc = tuple(x for i, x in enumerate(err["loc"])
                if not (i > 0 and isinstance(x, str) and x in _UNION_TAGS))
    path = ".".join(str(x) for x in loc) or "(root)"
    kind = err["type"]
    msg = err["msg"].removeprefix("Value error, ")
    raised = err.get("ctx", {}).get("error")
    if isinstance(raised, FieldError):
        return raised.path, str(raised)    # a check that names the field to fix
    if kind == "extra_forbidden":
        owner = _model_at(loc, data)
        allowed = ", ".join(sorted(owner.model_fields)) if owner else "see configs/"
        return path, f"unknown key; allowed keys here: {allowed}"
    got = err.get("input")
    got_s = "" if isinstance(got, dict) else f" (got {got!r})"
    if kind == "union_tag_invalid":
        ctx = err.get("ctx", {})
        return path, f"unknown type {ctx.get('tag')!r}; allowed: {ctx.get('expected_tags')}"
    if kind == "value_error":
        return path, msg
    return path, f"{msg}{got_s}"


def validate_config(data: dict[str, Any], check_files: bool = True) -> RunConfig:
    """Validate a plain dict (from TOML, JSON or a form) into a RunConfig.

    ``check_files`` also checks that the files the config names exist and hold what they
    should (model.path, task.path and eval_path, a reward file, the critic's path). Turn
    it off to re-read the config of a run that already ran, whose files may since have
    moved (the stored config stays readable), and on a client whose files live on the
    cluster (the CLI: the server checks them)."""
    try:
        return RunConfig.model_validate(data, context={"check_files": check_files})
    except ValidationError as exc:
        raise ConfigError([_format_error(e, data) for e in exc.errors()]) from None


def load_config(path: str | Path) -> RunConfig:
    """Read and validate a TOML run config."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([("(file)", f"{path} is not valid TOML: {exc}")]) from None
    return validate_config(data)


def loads_config(text: str) -> RunConfig:
    """Validate a TOML string."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([("(text)", f"not valid TOML: {exc}")]) from None
    return validate_config(data)


def dump_config(cfg: RunConfig) -> str:
    """TOML text of a config; ``loads_config(dump_config(c)) == c``."""
    return tomli_w.dumps(cfg.model_dump(mode="json", exclude_none=True))
