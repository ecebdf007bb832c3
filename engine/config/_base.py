"""What every config section shares: the strict pydantic base, the discriminated-union
helper that keys pluggable sections on their ``type`` field, and FieldError."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Discriminator, Tag


class FieldError(ValueError):
    """A check raised inside a section (often one spanning sections) that names the field
    to fix: ``path`` is where ConfigError reports it ("rollout.max_new_tokens"), whatever
    section pydantic was validating; ``str()`` is the message with the fix."""

    def __init__(self, path: str, message: str):
        self.path = path
        super().__init__(message)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, frozen=True)


_UNION_TAGS: set[str] = set()


def _choice(*members: type[_Section]) -> Any:
    """A union of sections keyed on their ``type`` field. A table without ``type`` means
    the first member, so a config need not spell out the only (or default) choice."""
    default = members[0].model_fields["type"].default
    tags = [m.model_fields["type"].default for m in members]
    _UNION_TAGS.update(tags)

    def tag_of(value: Any) -> str:
        if isinstance(value, dict):
            return value.get("type", default)
        return getattr(value, "type", default)

    annotated = [Annotated[m, Tag(t)] for m, t in zip(members, tags, strict=True)]
    union = annotated[0]
    for a in annotated[1:]:
        union = union | a
    return Annotated[union, Discriminator(tag_of)]
