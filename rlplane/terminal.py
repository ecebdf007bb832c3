"""Server text made inert before it reaches the terminal.

Run names, status reasons, log lines and alert causes are written by whoever holds a run's
token, so the CLI treats them as hostile: escape sequences (clear the screen, set the window
title, an OSC 8 hyperlink), other control characters and bidi overrides are dropped, and
rich markup ("[link=...]") is escaped where the text goes through rich.

    plain(text)   for print() and rich with markup=False
    inert(text)   for a rich table cell or markup string: plain, then markup escaped
"""

from __future__ import annotations

import re
import unicodedata

from rich.markup import escape

# CSI (ESC [ ... final), OSC / DCS / PM / APC / SOS strings (ended by BEL or ESC \),
# and two-character ESC sequences; their 8-bit C1 forms are dropped as control characters.
ESCAPE_SEQUENCE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b[\]PX^_][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[ -/]*[0-~]?")
BIDI = set("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def plain(text: object, *, newlines: bool = False) -> str:
    """``text`` without escape sequences, control characters (tabs become spaces; newlines
    too unless ``newlines``) or bidi overrides."""
    text = ESCAPE_SEQUENCE.sub("", str(text)).replace("\t", " ")
    keep = {"\n"} if newlines else set()
    if not newlines:
        text = text.replace("\r\n", " ").replace("\n", " ")
    return "".join(ch for ch in text if ch in keep or not (
        unicodedata.category(ch) == "Cc" or ch in BIDI))


def inert(text: object, *, newlines: bool = False) -> str:
    """plain(), with rich markup escaped: safe inside a Table cell or a markup string."""
    return escape(plain(text, newlines=newlines))
