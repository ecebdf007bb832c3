"""Tail the files a framework writes while it trains into an rlplane run (`rlplane
watch-files`), for frameworks that log to files rather than to a tracker we speak:

    run = rlplane.track.init(url, token, run_id)
    watch_files(run, ["metrics.jsonl", "rollouts/", "tensorboard/"], "verl", 2.0, stop)
      every poll_s, for each path, what was appended since the last poll:
        metrics.jsonl           veRL FileLogger / prime-rl FileMonitor -> run.log(step, ...)
        rollouts/<step>.jsonl   veRL trainer.rollout_data_dir           -> run.samples(step, rows)
        events.out.tfevents.*   TensorBoard (OpenRLHF, slime, veRL's    -> run.log(step, ...)
                                tensorboard backend), a file or a folder of them

Metrics keep the framework's own names: ingest maps them (engine.frameworks). Each tailer
remembers where it stopped (a byte offset; TensorBoard's loader keeps its own), so a
growing file is read once, and a line still being written waits for its newline. A path
that does not exist yet is looked for again at the next poll. Standard library only;
tensorboard is imported when a TensorBoard file is first tailed.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple, Protocol

TB_EVENT_GLOB = "events.out.tfevents.*"
log = logging.getLogger(__name__)


class Metrics(NamedTuple):
    step: int
    values: dict[str, float]


class Samples(NamedTuple):
    step: int
    rows: list[dict]


class RunLike(Protocol):
    """What of rlplane.track's Run the tailers feed."""
    def log(self, step: int, metrics: dict[str, float]) -> None: ...
    def samples(self, step: int, rows: list[dict]) -> None: ...


class Tailer(Protocol):
    def poll(self) -> list[Metrics | Samples]: ...


def scalars(values: dict) -> dict[str, float]:
    """The plottable values: numbers, not bools, lists or the nulls orjson writes for NaN."""
    return {name: float(v) for name, v in values.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}


class LineTail:
    """The complete lines appended to a file since the last call."""

    def __init__(self, path: Path):
        self.path = path
        self.offset = 0

    def lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                if f.seek(0, 2) < self.offset:      # truncated or replaced: read it anew
                    self.offset = 0
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        end = chunk.rfind(b"\n") + 1                # a partial last line waits
        self.offset += end
        return [line for line in chunk[:end].decode("utf-8").splitlines() if line.strip()]

    def records(self) -> list[dict]:
        """The new lines as JSON objects. A line that is not one (a file rewritten under
        the offset) is skipped with a warning: one bad line must not end the watch."""
        out = []
        for line in self.lines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                record = None
            if isinstance(record, dict):
                out.append(record)
            else:
                log.warning("%s: skipped a line that is not a JSON object: %.80s",
                            self.path, line)
        return out


def verl_record(record: dict) -> Metrics:
    """veRL's FileLogger line, verl/utils/tracking.py (0.8.0.dev): {"step": n, "data": {...}}."""
    return Metrics(int(record["step"]), scalars(record["data"]))


def prime_rl_record(record: dict) -> Metrics:
    """prime-rl's FileMonitor line, src/prime_rl/monitors/file.py (0.8.0):
    {"step": n, "time": unix_s, name: value, ...}."""
    return Metrics(int(record["step"]),
                   scalars({k: v for k, v in record.items() if k not in ("step", "time")}))


def any_record(record: dict) -> Metrics:
    return verl_record(record) if isinstance(record.get("data"), dict) else prime_rl_record(record)


JSONL_RECORDS: dict[str, Callable[[dict], Metrics]] = {
    "verl": verl_record, "prime-rl": prime_rl_record}


class MetricsJsonlTail:
    """A JSONL metrics log: one record per line, a step and its metrics."""

    def __init__(self, path: Path, framework: str | None = None):
        self.file = LineTail(path)
        self.parse = JSONL_RECORDS.get(framework or "", any_record)

    def poll(self) -> list[Metrics | Samples]:
        return [self.parse(record) for record in self.file.records()]


def verl_sample(entry: dict) -> dict:
    """One line of veRL's rollout dump (RayPPOTrainer._dump_generations, ray_trainer.py
    0.8.0.dev): {"input", "output", "gts", "score", "step", <reward extra infos>...}."""
    return {"prompt": entry["input"], "completion": entry["output"], "reward": entry["score"]}


class RolloutDumpTail:
    """veRL's trainer.rollout_data_dir: one <global_step>.jsonl per step, a line a sample."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.files: dict[Path, LineTail] = {}

    def poll(self) -> list[Metrics | Samples]:
        out: list[Metrics | Samples] = []
        paths = sorted(self.directory.glob("*.jsonl"),     # by step: 9.jsonl before 10.jsonl
                       key=lambda p: (int(p.stem) if p.stem.isascii() and p.stem.isdigit()
                                      else math.inf, p.name))
        for path in paths:
            entries = self.files.setdefault(path, LineTail(path)).records()
            by_step: dict[int, list[dict]] = {}
            for entry in entries:
                by_step.setdefault(int(entry["step"]), []).append(verl_sample(entry))
            out += [Samples(step, rows) for step, rows in by_step.items()]
        return out


class TensorBoardTail:
    """Scalars of TensorBoard event files (one file, or every one under a folder), read with
    tensorboard's own loader: legacy simple_value scalars and tensor-encoded ones alike
    (its data_compat layer turns the first into the second)."""

    def __init__(self, path: Path):
        try:
            from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
            from tensorboard.util import tensor_util
        except ImportError as exc:
            raise ImportError(f"{path} holds TensorBoard event files; reading them needs "
                              "tensorboard: pip install 'rlplane[tensorboard]'") from exc

        self.path = path
        self.loader_class = EventFileLoader
        self.to_array = tensor_util.make_ndarray
        self.loaders: dict[Path, EventFileLoader] = {}
        self.scalar_tags: set[str] = set()   # a tag's metadata comes with its first value only

    def event_files(self) -> list[Path]:
        if self.path.is_file():
            return [self.path]
        return sorted(self.path.rglob(TB_EVENT_GLOB))

    def poll(self) -> list[Metrics | Samples]:
        out: list[Metrics | Samples] = []
        for path in self.event_files():
            loader = self.loaders.get(path)
            if loader is None:
                loader = self.loaders[path] = self.loader_class(str(path))
            for event in loader.Load():
                values = self.event_scalars(event)
                if not values:
                    continue
                if out and out[-1].step == event.step:       # SummaryWriter: a tag an event
                    out[-1].values.update(values)
                else:
                    out.append(Metrics(int(event.step), values))
        return out

    def event_scalars(self, event) -> dict[str, float]:
        values: dict[str, float] = {}
        if not event.HasField("summary"):
            return values
        for value in event.summary.value:
            if value.metadata.plugin_data.plugin_name == "scalars":
                self.scalar_tags.add(value.tag)
            if value.tag in self.scalar_tags and value.HasField("tensor"):
                array = self.to_array(value.tensor)
                if array.size == 1:
                    values[value.tag] = array.item()
        return scalars(values)


def tailer_for(path: Path, framework: str | None = None) -> Tailer | None:
    """The tailer a path needs, or None while it does not exist. A folder holding event
    files (at any depth) is TensorBoard's, any other folder a veRL rollout dump; a file is
    an event file by its name, else a JSONL metrics log."""
    if path.is_dir():
        if next(path.rglob(TB_EVENT_GLOB), None) is not None:
            return TensorBoardTail(path)
        return RolloutDumpTail(path) if any(path.glob("*.jsonl")) else None
    if path.is_file():
        if path.name.startswith("events.out.tfevents."):
            return TensorBoardTail(path)
        return MetricsJsonlTail(path, framework)
    return None


def feed(run: RunLike, records: Iterable[Metrics | Samples]) -> None:
    for record in records:
        if isinstance(record, Samples):
            run.samples(record.step, record.rows)
        elif record.values:
            run.log(record.step, record.values)


def watch_files(run: RunLike, paths: Iterable[str | Path], framework: str | None = None,
                poll_s: float = 2.0, stop: Callable[[], bool] = lambda: False) -> None:
    """Feed ``run`` from ``paths`` every ``poll_s`` seconds until ``stop()`` is true; what
    was written before it turned true is still read (one last poll)."""
    tailers: dict[Path, Tailer | None] = {Path(p): None for p in paths}
    while True:
        stopping = stop()
        for path, tailer in tailers.items():
            if tailer is None:
                tailer = tailers[path] = tailer_for(path, framework)
            if tailer is not None:
                feed(run, tailer.poll())
        if stopping:
            return
        time.sleep(poll_s)
