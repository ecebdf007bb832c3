"""The task seam and the split logic every task shares."""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Problem:
    prompt: str        # what the policy sees after <bos>
    answer: str        # the exact completion that earns reward 1 (EOS not included)
    # a dataset's row (every column), handed to a user's reward function as keywords
    row: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # its place in the run's stream of training prompts (engine.orchestration.ledger);
    # None for a problem not drawn from it (eval, warm start, preflight)
    position: int | None = field(default=None, compare=False)


class Task(ABC):
    """A problem law with a held-out split. Subclasses draw one problem from an rng."""

    name: str
    seed: int
    eval_size: int
    format_penalty: float
    # Threads held-out evaluation scores with: 1 where scoring is Python arithmetic, more
    # where each score waits on a process of its own (a sandboxed program).
    score_threads: int = 1
    # Whether prompts are rendered with the model's chat template (they end with its
    # generation prompt): the warm start then ends a demonstration as the template ends
    # a turn, not with EOS.
    chat: bool = False

    def __init__(self) -> None:
        self._eval: list[Problem] | None = None

    @abstractmethod
    def draw(self, rng: random.Random) -> Problem: ...

    @abstractmethod
    def is_correct(self, problem: Problem, text: str) -> bool | None:
        """True/False for a well-formed answer, None when the text is malformed."""

    def demonstration(self, problem: Problem) -> str:
        """What the supervised warm start imitates after the prompt."""
        return problem.answer

    def demonstration_turns(self, problem: Problem) -> list[tuple[str, bool]]:
        """The demonstration as (text, trained) pieces: a multi-turn task's observations
        are context the warm start reads but does not imitate."""
        return [(self.demonstration(problem), True)]

    @property
    def epoch_size(self) -> int | None:
        """Training problems in one epoch; None: an endless stream (a synthetic task)."""
        return None

    def prompt_id(self, position: int) -> int:
        """The id of the training prompt at ``position`` of the "rl" stream (the data
        ledger hashes it): a synthetic problem is a function of its position."""
        return position

    def identity(self) -> dict:
        """What, besides the task's config, defines its problems (a cache key part)."""
        return {}

    def eval_problems(self) -> list[Problem]:
        if self._eval is None:
            rng = random.Random(f"{self.seed}:eval")
            seen: dict[str, Problem] = {}
            for _ in range(self.eval_size * 50):
                p = self.draw(rng)
                seen.setdefault(p.prompt, p)
                if len(seen) == self.eval_size:
                    break
            else:
                raise ValueError(
                    f"task.eval_size={self.eval_size} exceeds the distinct problems this "
                    "task can draw; lower eval_size or widen the task")
            self._eval = list(seen.values())
            self._eval_prompts = set(seen)
        return self._eval

    def train_problems(self, step: int, n: int, stream: str = "rl") -> list[Problem]:
        """n training problems for ``step`` of ``stream`` ("rl", "sft"); the same
        (seed, stream, step) gives the same list, and none is a held-out problem."""
        self.eval_problems()
        rng = random.Random(f"{self.seed}:{stream}:{step}")
        out: list[Problem] = []
        for _ in range(n * 50):
            p = self.draw(rng)
            if p.prompt not in self._eval_prompts:
                out.append(p)
                if len(out) == n:
                    return out
        raise ValueError("the held-out split covers almost every problem; lower task.eval_size")

    def score(self, problem: Problem, text: str, finished: bool) -> float:
        """1 for the exact answer, 0 for a wrong well-formed one, -format_penalty when the
        completion did not end with EOS inside the budget or is malformed."""
        if not finished:
            return -self.format_penalty
        ok = self.is_correct(problem, text)
        if ok is None:
            return -self.format_penalty
        return 1.0 if ok else 0.0
