"""Event sinks. A sink takes events in order; the driver owns it and closes it.

The control plane adds an HTTP sink (batched, spooled to disk when unreachable).
"""

from __future__ import annotations

import json
from pathlib import Path

from engine.events import Event, event_from_dict


class MemorySink:
    def __init__(self) -> None:
        self.events: list[Event] = []

    def emit(self, event: Event) -> None:
        self.events.append(event)

    def close(self) -> None:
        pass

    def of_type(self, cls: type[Event]) -> list:
        return [e for e in self.events if isinstance(e, cls)]


class JsonlSink:
    """One JSON object per line, flushed per event so a crash loses at most one line: a
    writer killed mid-line leaves it torn, which the next sink on the file ends (readers
    skip it) so that its own first event starts a line of its own."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        end_torn_line(path)
        self._f = path.open("a", encoding="utf-8")

    def emit(self, event: Event) -> None:
        self._f.write(json.dumps(event.to_dict()) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


class FanoutSink:
    def __init__(self, *sinks) -> None:
        self.sinks = [s for s in sinks if s is not None]

    def emit(self, event: Event) -> None:
        for s in self.sinks:
            s.emit(event)

    def close(self) -> None:
        for s in self.sinks:
            s.close()


def end_torn_line(path: Path) -> None:
    """End the partial last line a process killed mid-write may leave in a JSON-lines file,
    so the next append starts a line of its own (the torn one is skipped when read)."""
    if path.exists() and path.stat().st_size:
        with path.open("rb+") as f:
            f.seek(-1, 2)
            if f.read(1) != b"\n":
                f.write(b"\n")


def read_jsonl(path: Path) -> list[Event]:
    """The events of a JSON-lines file, less the lines a killed writer tore."""
    events = []
    with path.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                item = json.loads(line)
            except ValueError:               # torn (end_torn_line), or blank
                continue
            events.append(event_from_dict(item))
    return events


def last_seq(path: Path) -> int:
    """The highest seq in an events.jsonl (0 when there is none): a resumed run goes on
    from it, since consumers dedup by seq."""
    if not path.exists():
        return 0
    return max((e.seq for e in read_jsonl(path)), default=0)
