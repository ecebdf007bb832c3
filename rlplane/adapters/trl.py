"""A TRL GRPOTrainer (or RLOOTrainer) run reported to rlplane; tested with TRL 1.16.0.

    trainer = GRPOTrainer(model=..., reward_funcs=..., args=GRPOConfig(..., log_completions=True))
    trainer.add_callback(RlplaneCallback(trainer))   # RLPLANE_URL, RLPLANE_RUN_ID, RLPLANE_TOKEN
    trainer.train()

What each transformers hook does, on the world's process zero only:

    on_train_begin   rlplane.track.init(), unless a run was given
    on_step_begin    notes the time
    on_step_end      the step's span; a stop asked from rlplane -> control.should_training_stop,
                     so the loop ends after this step, logged and saved as usual
    on_log           the ``logs`` dict as TRL names it (reward, reward_std,
                     frac_reward_zero_std, kl, entropy, completions/mean_length,
                     completions/clipped_ratio, sampling/..., step_time, loss, grad_norm, ...):
                     the control plane maps a framework's names to rlplane's own. With the
                     trainer and ``log_completions`` on, also the step's completions as samples
    on_train_end     run.finish("succeeded"), or "stopped" after a stop from rlplane

Why the callback takes the trainer: transformers hands a callback the model, tokenizer,
optimizer and dataloaders, never the trainer, and TRL keeps the completions only on it
(``trainer._logs``: filled by ``_generate_and_score_completions`` before ``log()`` calls
``on_log``, so they are this step's). The parquet file TRL writes from them is written after
``on_log`` returns, and its columns do not say which are rewards and which are extra
columns. TRL's own LogCompletionsCallback takes the trainer for the same reason. Without
it the callback sends metrics and spans only.

The span: TRL generates inside ``training_step`` (``_prepare_inputs``), and no hook falls
between generation, scoring and the update, so a step is one "learner" span from
on_step_begin to on_step_end. Its gaps show where the loop did something else (logging,
saving, evaluation); TRL's ``step_time`` metric is the same step timed by TRL.

A failing hook never reaches training: its error is logged once and counted in ``errors``.
"""

from __future__ import annotations

import functools
import logging
import math
import numbers
import time
from typing import Any, Protocol

from transformers import TrainerCallback

logger = logging.getLogger(__name__)

STEP_PHASE = "learner"   # the whole step (see the module docstring)


class Run(Protocol):
    """What the callback needs of a run: rlplane.track's face."""

    stop_requested: bool

    def log(self, step: int, metrics: dict[str, float]) -> None: ...
    def span(self, phase: str, device: str, step: int, *, start: float, end: float) -> Any: ...
    def samples(self, step: int, rows: list[dict]) -> None: ...
    def finish(self, status: str = "succeeded", reason: str = "") -> None: ...


def _never_raises(hook):
    """Run a hook on the world's process zero only, with a run; record its error instead
    of raising it into the training loop."""
    @functools.wraps(hook)
    def guarded(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return None
        try:
            return hook(self, args, state, control, **kwargs)
        except Exception:
            self.errors += 1
            if self.errors == 1:
                logger.exception("rlplane: %s failed; training goes on, further errors "
                                 "are only counted", hook.__name__)
            return None
    return guarded


class RlplaneCallback(TrainerCallback):
    def __init__(self, trainer=None, run: Run | None = None):
        """``trainer``: the GRPOTrainer/RLOOTrainer this is added to, to send its
        completions; ``run``: where to report (default: ``rlplane.track.init()`` from the
        RLPLANE_* environment, when training begins)."""
        self.trainer = trainer
        self.run = run
        self.errors = 0
        self._step_start: float | None = None
        self._stopped = False
        self._last_rows: list[dict] = []

    @_never_raises
    def on_train_begin(self, args, state, control, **kwargs):
        if self.run is None:
            from rlplane import track
            self.run = track.init()

    @_never_raises
    def on_step_begin(self, args, state, control, **kwargs):
        self._step_start = time.time()

    @_never_raises
    def on_step_end(self, args, state, control, **kwargs):
        start, self._step_start = self._step_start, None
        if self.run is None:
            return
        if start is not None:
            self.run.span(STEP_PHASE, device=device_name(args), step=state.global_step,
                          start=start, end=time.time())
        if self.run.stop_requested and not self._stopped:
            logger.info("rlplane: stop requested; training ends after step %d",
                        state.global_step)
            self._stopped = True
            control.should_training_stop = True

    @_never_raises
    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.run is None or not logs:
            return
        metrics = {name: float(value) for name, value in logs.items()
                   if isinstance(value, numbers.Real) and not isinstance(value, bool)}
        if metrics:
            self.run.log(state.global_step, metrics)
        evaluating = any(name.startswith("eval_") for name in logs)
        if self.trainer is not None and args.log_completions and not evaluating:
            rows = completion_rows(self.trainer)
            # the same generation is logged again by the end-of-training log, and at
            # every step of one generation when steps_per_generation > 1
            if rows and rows != self._last_rows:
                self.run.samples(state.global_step, rows)
                self._last_rows = rows

    @_never_raises
    def on_train_end(self, args, state, control, **kwargs):
        if self.run is None:
            return
        if self._stopped:
            self.run.finish("stopped", "stop requested from rlplane")
        else:
            self.run.finish("succeeded")


def device_name(args) -> str:
    """The process's device as rlplane's spans name devices: "gpu:0", "cpu:0"."""
    device = args.device
    return f"{'gpu' if device.type == 'cuda' else device.type}:{device.index or 0}"


def completion_rows(trainer) -> list[dict]:
    """The completions of the trainer's latest generation as samples. A row's reward is
    TRL's: the weighted sum of the reward functions that scored it (``reward`` in the
    logs is their mean); a completion no function scored has reason "unscored"."""
    logs = trainer._logs
    weights = [float(w) for w in trainer.reward_weights]
    columns = [list(logs["rewards"][name]) for name in trainer.reward_func_names]
    rows = []
    for i, (prompt, completion, advantage) in enumerate(
            zip(logs["prompt"], logs["completion"], logs["advantages"], strict=True)):
        scored = [(w, column[i]) for w, column in zip(weights, columns, strict=True)
                  if not math.isnan(column[i])]
        row = {"group": i // trainer.num_generations, "prompt": message_text(prompt),
               "completion": message_text(completion),
               "reward": sum(w * r for w, r in scored), "advantage": float(advantage)}
        if not scored:
            row["reason"] = "unscored"
        rows.append(row)
    return rows


def message_text(value) -> str:
    """A prompt or completion as text: TRL keeps a conversational one as chat messages
    ({"role", "content"}, content a string or a list of typed parts)."""
    if isinstance(value, str):
        return value
    lines = []
    for message in value:
        content = message.get("content", "")
        if not isinstance(content, str):
            content = "".join(part.get("text", "") for part in content
                              if isinstance(part, dict))
        lines.append(f"{message.get('role', '')}: {content}")
    return "\n".join(lines)
