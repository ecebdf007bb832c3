"""Config sections of how completions are scored."""

from __future__ import annotations

import re
import sys
import sysconfig
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationInfo, model_validator

from engine.config._base import FieldError, _choice, _Section

# --------------------------------------------------------------------------- reward

class _RewardPool(_Section):
    workers: int = Field(default=0, ge=0, le=64)
    """Reward worker Ray actors. 0 scores in the driver's process after generation; >= 1
    streams each completion to the pool as it finishes, so scoring overlaps generation."""
    max_in_flight: int = Field(default=64, ge=1, le=65536)
    """Completions submitted but not yet scored; at the bound a new submit waits for one
    to finish (back-pressure on generation)."""


class RuleRewardConfig(_RewardPool):
    """A deterministic rule: the task's own verifier, exact match or numeric tolerance,
    after an optional format check. Each verdict carries a reason."""

    type: Literal["rule"] = "rule"
    match: Literal["task", "exact", "numeric"] = "task"
    """"task": the task's own verifier (its format rule, exact answer; runs the program for
    the code task); "exact": the text equals the answer; "numeric": within ``tolerance``."""
    tolerance: float = Field(default=0.0, ge=0.0, le=1e6)
    """Largest |completion - answer| that still counts as correct with match = "numeric"."""
    format_regex: str | None = Field(default=None, max_length=200)
    """A regex the whole completion must match, else reward = -format_penalty (reason
    "format"). None skips the check."""

    @model_validator(mode="after")
    def _regex_compiles(self) -> RuleRewardConfig:
        if self.format_regex is not None:
            try:
                re.compile(self.format_regex)
            except re.error as exc:
                raise FieldError("reward.format_regex",
                                 f"reward.format_regex={self.format_regex!r} is not a valid "
                                 f"regex ({exc}); fix the pattern") from None
        return self


class SandboxRewardConfig(_RewardPool):
    """Run the completion as a program against the task's unit tests in a contained
    process (engine/reward/sandbox.py). Needs task.type = "code"."""

    type: Literal["sandbox"] = "sandbox"
    timeout_s: float = Field(default=2.0, gt=0.0, le=60.0)
    """Wall-clock bound of one program run; the whole process tree is killed at it."""
    cpu_s: int = Field(default=2, ge=1, le=60)
    """CPU-time rlimit of the program, in seconds."""
    memory_mb: int = Field(default=256, ge=64, le=16384)
    """Address-space rlimit of the program, in MiB (the interpreter itself needs ~30)."""
    file_size_kb: int = Field(default=1024, ge=1, le=1_048_576)
    """Largest file the program may write, in KiB."""
    max_processes: int = Field(default=16, ge=1, le=1024)
    """Process-count rlimit of the sandbox's own uid (stops fork bombs)."""
    output_kb: int = Field(default=64, ge=1, le=65536)
    """Output read back before the program is killed (reason limit_exceeded)."""


class RewardModelConfig(_RewardPool):
    """A tiny transformer classifier, trained on the task's own correct and corrupted
    examples and served by a batching Ray actor. The task's verifier is scored alongside,
    so reward/rm_vs_verifier_agreement shows when the two part ways."""

    type: Literal["reward_model"] = "reward_model"
    train_steps: int = Field(default=300, ge=1, le=20_000)
    """Supervised steps of the classifier (cached per task and settings)."""
    batch_size: int = Field(default=64, ge=2, le=1024)
    """Examples per training step (half correct, half corrupted)."""
    max_batch: int = Field(default=64, ge=1, le=4096)
    """Most requests the served model scores in one forward pass."""
    batch_wait_ms: float = Field(default=5.0, ge=0.0, le=1000.0)
    """How long the server waits for more requests to fill a batch."""


class MathRewardConfig(_RewardPool):
    """Answer extraction and equivalence with the ``math-verify`` package: a GSM8K
    ``#### 42`` line, ``\\boxed{...}``, fractions, decimals and LaTeX forms, each verdict with
    a reason (correct, wrong, no_answer, unfinished, gold_unparsed)."""

    type: Literal["math"] = "math"
    timeout_s: int = Field(default=5, ge=1, le=60)
    """Bound on parsing and on comparing one answer (a SIGALRM timer, so it applies where
    the scorer runs in a process's main thread; elsewhere math-verify runs unbounded)."""


class PythonRewardConfig(_RewardPool):
    """Your own reward function, called as ``fn(prompt, completion, answer, **row) ->
    float`` in the rollout worker (or reward pool). ``row`` holds the dataset row's other
    columns. A call that raises or returns a non-number scores 0 with reason
    "reward_error"; its traceback goes to the run's log once per distinct error."""

    type: Literal["python"] = "python"
    function: str = Field(min_length=3, max_length=1000)
    """``package.module:callable`` (importable on the workers) or ``path/to/file.py:callable``
    (relative paths as for task.path)."""

    @model_validator(mode="after")
    def _function_named(self, info: ValidationInfo) -> PythonRewardConfig:
        problem = target_problem("reward.function", self.function, "callable",
                                 (info.context or {}).get("check_files", True))
        if problem is not None:
            raise FieldError("reward.function", problem)
        return self


def target_problem(field: str, spec: str, what: str, check_files: bool) -> str | None:
    """Why ``spec`` cannot name the user's own code (``package.module:<what>`` or
    ``path/to/file.py:<what>``): not that shape, a missing file (when ``check_files``), or
    a module or file of the standard library or of rlplane; None when it can. The reward
    function and an environment class (task.env.class) are both checked here, so a user
    cannot point either at code the run would trust more than their own."""
    target, _, name = spec.rpartition(":")
    if not target or not name.isidentifier():
        return (f"{field}={spec!r} must be \"package.module:{what}\" or "
                f"\"path/to/file.py:{what}\"")
    if is_file_target(target):
        from engine.config.datafile import resolve

        if check_files and not resolve(target).is_file():
            return (f"{field}={spec!r}: no such file {target!r}; fix the path (relative to "
                    "the working directory or the rlplane checkout)")
        owner = protected_owner(resolve(target))
        if owner is not None:
            return f"{field}={spec!r} names a file of {owner}; point it at your own module or file"
        return None
    if not all(part.isidentifier() for part in target.split(".")):
        return (f"{field}={spec!r}: {target!r} is not a module name; use dotted "
                "identifiers, or a path ending in .py")
    top = target.split(".")[0]
    if top in sys.stdlib_module_names or top == "engine":
        return (f"{field}={spec!r} names a module of "
                f"{'the standard library' if top != 'engine' else 'rlplane'}; "
                "point it at your own module or file")
    return None


def protected_owner(path: Path) -> str | None:
    """"the standard library" or "rlplane" when ``path`` (symlinks followed) is one of
    their files, as a module name of theirs is refused: naming os.py by its path must not
    get around that. A site-packages folder under the standard library's is not it."""
    real = path.resolve()
    if real.is_relative_to(Path(__file__).resolve().parents[1]):
        return "rlplane"
    for key in ("stdlib", "platstdlib"):
        base = Path(sysconfig.get_paths()[key]).resolve()
        if real.is_relative_to(base) and not (
                {"site-packages", "dist-packages"} & set(real.relative_to(base).parts)):
            return "the standard library"
    return None


def is_file_target(target: str) -> bool:
    return target.endswith(".py") or "/" in target


RewardConfig = _choice(RuleRewardConfig, SandboxRewardConfig, RewardModelConfig,
                       MathRewardConfig, PythonRewardConfig)
