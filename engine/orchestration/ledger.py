"""The run's data position and its ledger: which training prompts were served, trained or
dropped, so a resumed run continues its data where the checkpoint left it.

    stream = resume_stream(task, block, ckpt, skip, log)   # fresh, or from ckpt/data.json
    problems = stream.draw(n)           # the next n prompts; each Problem.position set
    stream.ledger.resolve(p, None)      # its group trained ("filter", "stale": dropped)
    stream.ledger.metrics()             # data/served, data/trained, data/dropped, ...
    checkpoint_files(ledger)            # {data.json: ...}, in the learner's checkpoint

Position p is the p-th prompt of the run's one stream of training prompts: a dataset's
epoch ``p // size`` in that epoch's shuffled order (engine/tasks/dataset.py), a synthetic
task's endless stream in blocks of ``block`` (``train_problems(p // block, block)``, so
the sync policy draws what it drew when it indexed problems by step). Every policy draws
from the stream, so a run serves each position once: each epoch's prompts exactly once.

The ledger counts what happened to each position: served (drawn for generation),
trained, dropped by reason (``filter``: dynamic sampling's flat groups; ``stale``: over
the staleness bound; ``error``: lost to a failure). Positions served and not yet trained
or dropped are pending (in flight, in the buffer, carried unfinished): a checkpoint keeps
them and the resumed run serves them again first, counted once. A position served past
the ledger's frontier leaves a gap (``skipped``); one served or trained again after it
was resolved is a repeat (``repeated``): the DataIntegrity rule fires on either.

The running hash folds in each served prompt's id (a dataset's row index; a synthetic
task's position) in order: xxh64 when ``xxhash`` is installed, else blake2b-64
(``HASH``); two runs that served the same prompts in the same order agree on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from engine import metrics as M
from engine.tasks.base import Problem, Task

DATA_FILE = "data.json"                   # in each checkpoint directory
DROP_REASONS = ("filter", "stale", "error")

try:
    import xxhash

    HASH = "xxh64"

    def _fold(digest: int, prompt_id: int) -> int:
        return xxhash.xxh64_intdigest(_pair(digest, prompt_id))
except ImportError:                        # pragma: no cover - the venv has xxhash
    import hashlib

    HASH = "blake2b64"

    def _fold(digest: int, prompt_id: int) -> int:
        return int.from_bytes(hashlib.blake2b(_pair(digest, prompt_id),
                                              digest_size=8).digest(), "little")


def _pair(digest: int, prompt_id: int) -> bytes:
    return digest.to_bytes(8, "little") + prompt_id.to_bytes(8, "little", signed=True)


def running_hash(prompt_ids: list[int], digest: int = 0) -> int:
    """The ledger's hash after serving ``prompt_ids`` in order, from ``digest``."""
    for i in prompt_ids:
        digest = _fold(digest, i)
    return digest


@dataclass
class DataLedger:
    epoch_size: int | None = None          # a dataset's training rows; None: endless stream
    position: int = 0                      # frontier: every position below it was served
    served: int = 0
    trained: int = 0
    dropped: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DROP_REASONS, 0))
    skipped: int = 0                       # positions passed over, never served
    repeated: int = 0                      # positions served or trained again when resolved
    digest: int = 0                        # running hash of the prompt ids served
    pending: set[int] = field(default_factory=set)
    resumed: set[int] = field(default_factory=set)   # pending at the checkpoint, not yet
                                                     # served again by this process

    def serve(self, position: int, prompt_id: int) -> None:
        if position in self.resumed:       # the checkpoint's pending: served again, once
            self.resumed.discard(position)
            self.pending.add(position)
            return
        if position >= self.position:
            self.skipped += position - self.position
            self.position = position + 1
            self.served += 1
            self.digest = _fold(self.digest, prompt_id)
        else:
            self.repeated += 1
        self.pending.add(position)

    def resolve(self, position: int, dropped: str | None = None) -> None:
        """Position's group trained (``dropped`` None) or dropped for that reason."""
        if position in self.pending:
            self.pending.discard(position)
        else:
            self.repeated += 1             # trained or dropped twice, or never served
        if dropped is None:
            self.trained += 1
        else:
            self.dropped[dropped] += 1

    @property
    def epoch(self) -> int:
        """The epoch of the latest prompt served (0 for an endless stream)."""
        return max(self.position - 1, 0) // self.epoch_size if self.epoch_size else 0

    def metrics(self) -> dict[str, float]:
        m = {M.DATA_SERVED: self.served, M.DATA_TRAINED: self.trained,
             M.DATA_DROPPED: sum(self.dropped.values()), M.DATA_EPOCH: self.epoch,
             M.DATA_SKIPPED: self.skipped, M.DATA_REPEATED: self.repeated}
        m |= {M.DATA_DROPPED_BY.of(reason=r): n for r, n in self.dropped.items()}
        return {k: float(v) for k, v in m.items()}

    def state(self) -> dict:
        """What a checkpoint keeps (data.json); ``resumed`` positions are still pending."""
        return {"epoch_size": self.epoch_size, "position": self.position,
                "served": self.served, "trained": self.trained, "dropped": self.dropped,
                "skipped": self.skipped, "repeated": self.repeated, "hash": HASH,
                "digest": f"{self.digest:016x}",
                "pending": sorted(self.pending | self.resumed)}

    @classmethod
    def from_state(cls, state: dict) -> DataLedger:
        """A ledger continuing a checkpoint's; its pending positions are to serve again.
        A digest of another hash than this engine's (HASH) restarts at 0."""
        pending = set(state["pending"])
        return cls(epoch_size=state["epoch_size"], position=state["position"],
                   served=state["served"], trained=state["trained"],
                   dropped=dict.fromkeys(DROP_REASONS, 0) | state["dropped"],
                   skipped=state["skipped"], repeated=state["repeated"],
                   digest=int(state["digest"], 16) if state["hash"] == HASH else 0,
                   resumed=pending)


def epoch_size(task: Task) -> int | None:
    """Training prompts in one of the task's epochs; None: an endless stream (a
    synthetic task, or a stand-in that only has train_problems)."""
    return getattr(task, "epoch_size", None)


def prompt_id(task: Task, position: int) -> int:
    """The id the ledger hashes for ``position``: the task's, else the position."""
    return task.prompt_id(position) if hasattr(task, "prompt_id") else position


class DataStream:
    """The run's training prompts by position (module docstring), from ``start`` on, the
    ``requeue`` positions first."""

    def __init__(self, task: Task, block: int, ledger: DataLedger | None = None,
                 start: int | None = None, requeue: list[int] | tuple[int, ...] = ()):
        self.task, self.block = task, block
        self.ledger = ledger or DataLedger(epoch_size(task))
        self.next = self.ledger.position if start is None else start
        self.requeue = list(requeue)
        self._block: tuple[int, list[Problem]] = (-1, [])

    def problem_at(self, position: int) -> Problem:
        index, offset = divmod(position, self.block)
        if self._block[0] != index:
            self._block = (index, self.task.train_problems(index, self.block))
        return replace(self._block[1][offset], position=position)

    def draw(self, n: int) -> list[Problem]:
        out = []
        for _ in range(n):
            if self.requeue:
                position = self.requeue.pop(0)
            else:
                position, self.next = self.next, self.next + 1
            self.ledger.serve(position, prompt_id(self.task, position))
            out.append(self.problem_at(position))
        return out


def resume_stream(task: Task, block: int, ckpt: Path | None, skip: int = 0,
                  log=None) -> DataStream:
    """The stream a run starts with: fresh, or continuing the checkpoint's ledger (its
    pending prompts first). ``skip`` (faults.skip_on_resume) starts a resumed stream that
    many prompts past the checkpoint's position, as a resume that loses its place does."""
    if ckpt is None:
        return DataStream(task, block)
    path = ckpt / DATA_FILE
    if not path.exists():
        # A checkpoint from before the ledger: its data position is the sync policy's rule.
        step = json.loads((ckpt / "state.json").read_text())["step"]
        ledger = DataLedger(epoch_size(task), position=step * block, served=step * block)
        if log is not None:
            log(f"checkpoint {ckpt.name} holds no {DATA_FILE}: the data position is taken "
                f"as step {step} x {block} prompts, and the ledger starts there",
                level="warning")
        return DataStream(task, block, ledger)
    state = json.loads(path.read_text())
    ledger = DataLedger.from_state(state)
    if ledger.epoch_size != epoch_size(task):
        # A fork onto other data: the checkpoint's position means nothing in it.
        if log is not None:
            log(f"checkpoint {ckpt.name}'s data ledger is of {ledger.epoch_size} training "
                f"rows, the run's task has {epoch_size(task)}: its data starts at the "
                "beginning, with a new ledger", level="warning")
        return DataStream(task, block)
    if state["hash"] != HASH and log is not None:
        log(f"checkpoint {ckpt.name}'s data ledger hashes with {state['hash']}, this engine "
            f"with {HASH}: the running hash restarts (the counts go on)", level="warning")
    stream = DataStream(task, block, ledger, start=ledger.position + skip,
                        requeue=sorted(ledger.resumed))
    if log is not None:
        log(f"data resumed at position {ledger.position} (epoch {ledger.epoch}): "
            f"{ledger.served} prompts served, {ledger.trained} trained, "
            f"{sum(ledger.dropped.values())} dropped, {len(ledger.resumed)} pending at the "
            f"checkpoint served again first; hash {HASH} {ledger.digest:016x}")
    return stream


def checkpoint_files(ledger: DataLedger) -> dict[str, str]:
    """What a checkpoint keeps of ``ledger``, by file name: the learner writes them into
    the checkpoint before it is renamed into place (engine.learner.checkpoint), so every
    checkpoint a resume can take holds them."""
    return {DATA_FILE: json.dumps(ledger.state())}
