"""The user's own reward: ``reward.function`` loaded in the worker and called per sample.

    fn = load_function("rewards/gsm8k.py:score")      # or "mypkg.rewards:score"
    fn(prompt, completion, answer, **row) -> float   row: the dataset row's other columns

    raises / returns a non-number (or nan, inf) -> 0.0, reason "reward_error", and the
        Verdict carries the traceback; the reward service logs each distinct one once
    otherwise                                        -> float(value), "scored"

Every completion is scored by the function, those cut off by the token budget too (as
TRL's and veRL's reward functions are); response/truncated_frac counts those.

It runs in the rollout worker's process (or a reward pool's), with the run's rights: the
config names code the cluster will execute, so only operators who may launch runs write it.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import numbers
import sys
import traceback
from collections.abc import Callable

from engine.config import ConfigError, PythonRewardConfig
from engine.config.datafile import resolve
from engine.config.reward import is_file_target
from engine.reward.verdict import Verdict
from engine.tasks.base import Problem, Task

POSITIONAL = ("prompt", "completion", "answer")


def load_function(spec: str, field: str = "reward.function",
                  what: str = "a function") -> Callable[..., object]:
    """The callable ``spec`` names (``what``: "a function", or "a class" for
    task.env.class); ConfigError naming ``field`` when it cannot be had."""
    target, _, name = spec.rpartition(":")

    def bad(why: str) -> ConfigError:
        return ConfigError([(field, f"{spec!r}: {why}")])

    try:
        if is_file_target(target):
            path = resolve(target)
            if not path.is_file():
                raise bad(f"no such file {target!r}; fix the path (relative to the working "
                          "directory or the rlplane checkout)")
            module_name = f"rlplane_user_{abs(hash(str(path.resolve())))}"
            module_spec = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[module_name] = module      # dataclasses and pickling look it up
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except ConfigError:
        raise
    except Exception as exc:
        raise bad(f"loading {target!r} raised {type(exc).__name__}: {exc}; fix the module "
                  "(or install it where the workers run)") from exc
    fn = getattr(module, name, None)
    if fn is None:
        have = ", ".join(n for n in vars(module) if not n.startswith("_")
                         and callable(vars(module)[n])) or "nothing callable"
        raise bad(f"{target!r} defines no {name!r} (it has {have}); fix the name after ':'")
    if not callable(fn):
        raise bad(f"{name!r} in {target!r} is a {type(fn).__name__}, not {what}")
    return fn


def _user_frames(exc: BaseException) -> str:
    """The traceback from the user's function down (the judge's own frame left out)."""
    tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
    return "".join(traceback.format_exception(type(exc), exc, tb)).rstrip()


class PythonRewardJudge:
    kind = "python"

    def __init__(self, cfg: PythonRewardConfig, task: Task):
        self.fn = load_function(cfg.function)

    def judge(self, problem: Problem, text: str, finished: bool) -> Verdict:
        row = {k: v for k, v in problem.row.items() if k not in POSITIONAL}
        try:
            value = self.fn(problem.prompt, text, problem.answer, **row)
        except Exception as exc:
            return Verdict(0.0, "reward_error", detail=_user_frames(exc))
        if not isinstance(value, numbers.Real) or not math.isfinite(value):
            what = value if isinstance(value, numbers.Real) else f"a {type(value).__name__}"
            return Verdict(0.0, "reward_error",
                           detail=f"reward.function returned {what}, not a finite number "
                                  f"(return a float)")
        return Verdict(float(value), "scored")


def error_key(detail: str) -> str:
    """What makes two reward errors the same: the last line of the traceback (exception
    type and message)."""
    lines = [li for li in detail.splitlines() if li.strip()]
    return lines[-1] if lines else detail

