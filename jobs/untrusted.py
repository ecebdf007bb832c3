"""Bounds on a client's parsed JSON or TOML before anything stores or validates it.

    MAX_DEPTH     nesting of objects/arrays (a run config nests 4 levels); deeper recursion
                  in a validator or serializer would raise RecursionError (a 500)
    NUL, a lone   PostgreSQL stores neither in text or jsonb (SQLite cannot encode the
    surrogate     surrogate): refused at the field that holds it, not failed at the save

``storable_problem`` walks iteratively, so its own depth is no limit.
"""

from __future__ import annotations

MAX_DEPTH = 32


def text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "contains a NUL character (\\u0000); remove it"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return "contains a lone surrogate (\\ud800-\\udfff), which is not text; remove it"
    return None


def storable_problem(data: object, max_depth: int = MAX_DEPTH) -> tuple[str, str] | None:
    """(field path, message) of the first value that cannot be stored, or None."""
    stack: list[tuple[str, object, int]] = [("", data, 0)]
    while stack:
        path, value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth >= max_depth:
                return path or "(body)", f"nests deeper than {max_depth} levels"
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(key, str) and (problem := text_problem(key)):
                    return path or "(body)", f"a key {problem}"
                stack.append((f"{path}.{key}" if path else str(key), item, depth + 1))
        elif isinstance(value, str) and (problem := text_problem(value)):
            return path or "(body)", problem
    return None
