"""Where a config field sits in the TOML text the operator wrote (tomllib gives no positions).

    line_of(text, "placement.rollout_workers")  -> 14   (1-based)

    1  name = "demo"                   ("name",)
    2  [placement]                     ("placement",)              a table header
    3  type = "disaggregated"          ("placement", "type")
    4  rollout_workers = 0             ("placement", "rollout_workers")   <- the field
    5  [faults.straggler]              ("faults", "straggler")

Each line that opens a table or sets a key gets the full key path it stands for; a field's
line is the one whose path equals the field's, else the one with the longest prefix of it
(a missing key points at its table's header, a key inside an inline table at that key's
line). Array-of-tables ([[x]]) count their entries, so "x.1.y" finds the second. The
scanner reads header and key lines only; multi-line strings and arrays are skipped over
by the parser's own view of the text: a line inside one never starts a key.
"""

from __future__ import annotations

import re

BARE = r"[A-Za-z0-9_-]+"
QUOTED = r'"(?:[^"\\]|\\.)*"|\'[^\']*\''
KEY = rf"(?:{BARE}|{QUOTED})(?:\s*\.\s*(?:{BARE}|{QUOTED}))*"
HEADER = re.compile(rf"^\s*(\[\[?)\s*({KEY})\s*\]\]?\s*(#.*)?$")
ASSIGN = re.compile(rf"^\s*({KEY})\s*=")
PART = re.compile(rf"{BARE}|{QUOTED}")


def _parts(key: str) -> tuple[str, ...]:
    return tuple(p.strip("\"'") for p in PART.findall(key))


def key_lines(text: str) -> list[tuple[int, tuple[str, ...]]]:
    """(line number, key path) of every header and key line, in order."""
    out: list[tuple[int, tuple[str, ...]]] = []
    table: tuple[str, ...] = ()
    arrays: dict[tuple[str, ...], int] = {}
    open_quote: str | None = None        # inside a multi-line string
    depth = 0                            # inside a multi-line array
    for number, line in enumerate(text.splitlines(), start=1):
        if open_quote:
            if open_quote in line:
                open_quote = None
            continue
        if depth <= 0 and (m := HEADER.match(line)):
            path = _parts(m.group(2))
            if m.group(1) == "[[":
                arrays[path] = arrays.get(path, -1) + 1
                path = (*path, str(arrays[path]))
            table = path
            out.append((number, table))
            continue
        if depth <= 0 and (m := ASSIGN.match(line)):
            out.append((number, (*table, *_parts(m.group(1)))))
            rest = line[m.end():]
        else:
            rest = line
        for quote in ('"""', "'''"):
            if rest.count(quote) % 2 == 1:
                open_quote = quote
        code = re.sub(QUOTED, "", rest).split("#", 1)[0]
        depth += code.count("[") - code.count("]")
    return out


def line_of(text: str, path: str) -> int | None:
    """The 1-based line of ``path`` (a ConfigError field path) in ``text``, or None when
    no line stands for it or for a table above it."""
    want = tuple(path.split("."))
    best, best_len = None, 0
    for number, keys in key_lines(text):
        n = len(keys)
        if n > best_len and want[:n] == keys:
            best, best_len = number, n
            if n == len(want):
                break
    return best
