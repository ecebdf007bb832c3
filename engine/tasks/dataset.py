"""Your own data: a local file read with the ``datasets`` library, as a Task.

    task = DatasetTask(cfg.task, tokenizer, seed=cfg.model.seed, log=print)
      check   the same file checks as the config (engine/config/datafile.py), every row
      load    datasets: json / parquet builders, or load_from_disk; local files only
      render  prompt text as is, or chat messages -> tokenizer.apply_chat_template
      drop    prompts over max_prompt_tokens (counted in a log line)
      split   eval_path, or the eval_fraction of distinct prompts with the lowest
              sha256(prompt): the same held-out set for every seed and row order
    task.train_problems(index, n)     positions index*n .. index*n+n-1 of an endless
        stream of epochs; epoch e is the training rows shuffled by (seed, stream, e), so
        a step's problems depend on nothing but its index (resume and the streaming
        policies rely on that). The sync policy walks each epoch exactly once.
    task.eval_problems()              the first eval_size held-out prompts
    task.is_correct(problem, text)    math-verify equivalence with the answer column

Every problem is a ConfigError naming the field and the fix (the config checks the first
rows cheaply; here all of them are read).
"""

from __future__ import annotations

import hashlib
import math
import os
import random
from functools import lru_cache
from typing import Any

from engine.config import ConfigError, DatasetTaskConfig
from engine.config.datafile import (
    DataFileError,
    check_row,
    data_format,
    is_messages,
    lookup,
    probe,
)
from engine.model import chat_prompt, encode_prompt
from engine.tasks.base import Problem, Task


def read_rows(field: str, raw: str, cfg: DatasetTaskConfig) -> list[dict[str, Any]]:
    """Every row of the file at ``raw`` as a dict; ConfigError naming ``field`` on any
    problem (the file, a line, a column, an empty dataset)."""
    try:
        probe(field, raw, cfg.columns(), max_rows=None)
        path, fmt = data_format(field, raw)
    except DataFileError as exc:
        raise ConfigError([(exc.field, str(exc))]) from None
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")      # local files: never the hub
    import datasets

    datasets.disable_progress_bars()
    try:
        if fmt == "disk":
            ds = datasets.load_from_disk(str(path))
        else:
            ds = datasets.load_dataset(fmt, data_files=str(path), split="train",
                                       keep_in_memory=True)
    except Exception as exc:                 # datasets' own errors: name the file and field
        raise ConfigError([(field, f"{field}={raw!r} cannot be loaded by datasets "
                                   f"({type(exc).__name__}: {exc}); fix or rewrite the file")]
                          ) from None
    if isinstance(ds, datasets.DatasetDict):
        raise ConfigError([(field, f"{field}={raw!r} holds a DatasetDict; point it at one "
                                   f"split's directory")])
    rows = ds.to_list()
    if not rows:
        raise ConfigError([(field, f"{field}={raw!r} holds no rows; point it at data with "
                                   f"at least one example")])
    if fmt != "json":                   # the probe read JSON rows, the others' schema only
        try:
            for i, row in enumerate(rows, 1):
                check_row(field, raw, f"row {i}", row, cfg.columns())
        except DataFileError as exc:
            raise ConfigError([(exc.field, str(exc))]) from None
    return rows


def render(cfg: DatasetTaskConfig, prompt: Any, tokenizer) -> str:
    """The text the policy is prompted with."""
    if not cfg.chat_template:
        if is_messages(prompt):
            raise ConfigError([("task.chat_template", "task.chat_template=false, and task."
                                f"prompt_key={cfg.prompt_key!r} holds chat messages; set "
                                "task.chat_template = true (or choose a text column)")])
        return prompt
    messages = list(prompt) if is_messages(prompt) else [{"role": "user", "content": prompt}]
    if cfg.system_prompt is not None and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": cfg.system_prompt})
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError([("task.chat_template", "task.chat_template=true, and the model's "
                            "tokenizer has no chat template; set task.chat_template = false "
                            "or use a model whose tokenizer_config.json has one")])
    return chat_prompt(tokenizer, messages)


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class DatasetTask(Task):
    name = "dataset"

    def __init__(self, cfg: DatasetTaskConfig, tokenizer, seed: int = 0, log=None):
        super().__init__()
        self.cfg, self.seed = cfg, seed
        self.eval_size, self.format_penalty = cfg.eval_size, cfg.format_penalty
        self.chat = cfg.chat_template
        train, dropped = self._problems("task.path", cfg.path, tokenizer)
        if cfg.eval_path is not None:
            held, dropped_eval = self._problems("task.eval_path", cfg.eval_path, tokenizer)
            dropped += dropped_eval
            held_prompts = {p.prompt for p in held}
            if not held:
                raise ConfigError([("task.max_prompt_tokens", f"task.max_prompt_tokens="
                                    f"{cfg.max_prompt_tokens} drops every held-out prompt; "
                                    "raise it")])
        else:
            distinct = sorted({p.prompt for p in train}, key=_hash)
            k = max(1, math.ceil(cfg.held_out_fraction() * len(distinct)))
            if k >= len(distinct):
                raise ConfigError([("task.eval_fraction", f"task.eval_fraction="
                                    f"{cfg.held_out_fraction()} holds out all {len(distinct)} "
                                    "distinct prompts; lower it or set task.eval_path")])
            held_prompts = set(distinct[:k])
            held = [p for p in train if p.prompt in held_prompts]
        leaked = sum(p.prompt in held_prompts for p in train)
        self.train = [p for p in train if p.prompt not in held_prompts]
        if not self.train:
            raise ConfigError([("task.path", f"task.path={cfg.path!r}: no training row is "
                                "left (every prompt is held out or too long); add rows or "
                                "raise task.max_prompt_tokens")])
        first: dict[str, Problem] = {}
        for p in sorted(held, key=lambda p: _hash(p.prompt)):
            first.setdefault(p.prompt, p)
        self._eval = list(first.values())[:cfg.eval_size]
        self._eval_prompts = held_prompts
        if log is not None:
            note = f"; {dropped} prompt(s) over max_prompt_tokens={cfg.max_prompt_tokens} " \
                   "dropped" if dropped else ""
            also = f"; {leaked} training row(s) with a held-out prompt dropped" if leaked else ""
            log(f"dataset {cfg.path}: {len(self.train)} training rows (one epoch), "
                f"{len(held_prompts)} held-out prompts ({len(self._eval)} evaluated){note}"
                f"{also}", level="warning" if dropped else "info")

    def _problems(self, field: str, raw: str, tokenizer) -> tuple[list[Problem], int]:
        cfg = self.cfg
        rows = read_rows(field, raw, cfg)
        texts = [render(cfg, lookup(r, cfg.prompt_key)[1], tokenizer) for r in rows]
        lengths = [len(encode_prompt(tokenizer, t)) for t in texts]
        out = [Problem(prompt=t, answer=str(lookup(r, cfg.answer_key)[1]), row=r)
               for r, t, n in zip(rows, texts, lengths, strict=True)
               if n <= cfg.max_prompt_tokens]
        if not out:
            raise ConfigError([("task.max_prompt_tokens", f"task.max_prompt_tokens="
                                f"{cfg.max_prompt_tokens} drops every prompt of {field}="
                                f"{raw!r} (the shortest has {min(lengths)} tokens); raise it")])
        return out, len(rows) - len(out)

    # ------------------------------------------------------------------ the Task seam

    def draw(self, rng: random.Random) -> Problem:
        return rng.choice(self.train)

    def eval_problems(self) -> list[Problem]:
        return self._eval

    @lru_cache(maxsize=16)           # noqa: B019 -- one task per process, a few epochs live
    def _order(self, stream: str, epoch: int) -> tuple[int, ...]:
        order = list(range(len(self.train)))
        random.Random(f"{self.seed}:{stream}:{epoch}").shuffle(order)
        return tuple(order)

    def train_problems(self, step: int, n: int, stream: str = "rl") -> list[Problem]:
        size, out = len(self.train), []
        for pos in range(step * n, step * n + n):
            epoch, offset = divmod(pos, size)
            out.append(self.train[self._order(stream, epoch)[offset]])
        return out

    @property
    def epoch_size(self) -> int:
        return len(self.train)

    def prompt_id(self, position: int) -> int:
        """The training row's index at ``position``: epoch ``position // size`` in its
        shuffled order."""
        epoch, offset = divmod(position, len(self.train))
        return self._order("rl", epoch)[offset]

    def demonstration(self, problem: Problem) -> str:
        if self.cfg.sft_key is None:
            return problem.answer
        return str(lookup(problem.row, self.cfg.sft_key)[1])

    def identity(self) -> dict:
        digest = hashlib.sha256()
        for p in self.train + self._eval:
            digest.update(f"{p.prompt}\0{p.answer}\0{self.demonstration(p)}\0".encode())
        return {"data": digest.hexdigest()[:16]}

    def is_correct(self, problem: Problem, text: str) -> bool | None:
        from engine.reward.math_answer import verdict_of

        reason = verdict_of(problem.answer, text, self.format_penalty).reason
        return {"correct": True, "no_answer": None}.get(reason, False)
