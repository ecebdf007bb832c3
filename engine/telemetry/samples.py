"""The rollout inspector's view of a step: pure functions the loop calls.

    rows  = inspected_rows(groups, telemetry.sample_groups)   # the first groups, whole
    lp    = learner.token_logprobs(rows)                      # (len(rows), R), padded
    tel.emit(samples_event(step, samples, rows, staleness, lp, token_text))

Each rollout carries what an operator reads when a curve moves: the prompt, the
completion, its reward and the judge's reason, its advantage, the versions that generated
it and its staleness, and per response token the behaviour logprob (rollout engine) next to
the learner's (recomputed before the update): where they part is where the engines disagree.
A multi-turn trajectory (task.type "env") also carries its turns: model turns with their
version and step reward, observations with no logprobs (nothing was sampled there).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from engine.events import SAMPLE_TOKEN_LIMIT, RolloutSample, SamplesEvent, TrajectoryTurn
from engine.experience import Sample


def inspected_rows(groups: Sequence[Sequence[Sample]], n_groups: int) -> list[int]:
    """Indices, in the step's flat sample list, of the first ``n_groups`` groups."""
    return list(range(sum(len(g) for g in groups[:n_groups])))


def logprob(x: float) -> float | None:
    """Rounded to what a colour scale can show; None where not finite (JSON has no inf)."""
    return round(x, 4) if math.isfinite(x) else None


def samples_event(step: int, samples: Sequence[Sample], rows: list[int],
                  staleness: Sequence[int], learner_logprobs: list[list[float]],
                  token_text: Callable[[int], str]) -> SamplesEvent:
    """The samples event of rows ``rows`` of the step's ``samples``; ``learner_logprobs``
    has one (padded) row per entry of ``rows``."""
    out = []
    for i, learner in zip(rows, learner_logprobs, strict=True):
        s = samples[i]
        n = min(len(s.response_ids), SAMPLE_TOKEN_LIMIT)
        behaviour, learner = s.behaviour_logprobs[:n], learner[:n]
        if s.loss_mask is not None:             # an observation's tokens: no gap to shade
            behaviour = [b if m else None for b, m in zip(behaviour, s.loss_mask, strict=False)]
            learner = [x if m else None for x, m in zip(learner, s.loss_mask, strict=False)]
        out.append(RolloutSample(
            group=s.group, prompt=s.problem.prompt, completion=s.text, reward=s.reward,
            reason=s.reason, advantage=s.advantage, version=s.version,
            last_version=s.version if s.last_version is None else s.last_version,
            staleness=staleness[i], length=len(s.response_ids), truncated=not s.finished,
            tokens=[token_text(t) for t in s.response_ids[:n]],
            behaviour_logprobs=[None if x is None else logprob(x) for x in behaviour],
            learner_logprobs=[None if x is None else logprob(x) for x in learner],
            turns=trajectory_turns(s)))
    return SamplesEvent(step=step, samples=out)


def trajectory_turns(s: Sample) -> list[TrajectoryTurn]:
    """A multi-turn sample's turns: its environment record's model turns (tokens, version,
    the reward of the step that answered each) and the observations between and after
    them; [] for a single-turn sample."""
    if s.loss_mask is None or s.env is None:
        return []
    turns: list[TrajectoryTurn] = []
    at = 0
    for r in s.env.turn_log:
        if r.start > at:
            turns.append(TrajectoryTurn("env", at, r.start))
        if r.end > r.start:
            turns.append(TrajectoryTurn("model", r.start, r.end, r.version, r.reward))
        at = max(at, r.end)
    if len(s.loss_mask) > at:
        turns.append(TrajectoryTurn("env", at, len(s.loss_mask)))
    return turns
