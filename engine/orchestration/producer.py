"""Turns problems into experience: rollout engine -> reward -> groups of samples.

    rows = each problem x group_size
    engine.generate(rows, params, seed)                     [span: rollout]
        each completion as it finishes (on_complete): its time since the call began
        (Sample.gen_s: a straggler is a sample, not a step), and a streaming reward (a
        pool) gets it to score while the rest still generate
    decode, reward.verdicts(...) or pool.collect(...)          [span: reward]
    -> one group (list[Sample]) per problem, tagged with the engine's weight version

A multi-turn task's groups are trajectories instead (TrajectoryProducer).
"""

from __future__ import annotations

import time

from engine.experience import Sample
from engine.model import encode_prompt
from engine.reward import RewardFn
from engine.rollout.base import RolloutEngine, SamplingParams
from engine.rollout.multiturn import TrajectoryRunner
from engine.tasks.base import Problem
from engine.telemetry.recorder import SpanRecorder


def split(items: list, parts: int) -> list[list]:
    """``items`` in ``parts`` contiguous slices whose sizes differ by at most one."""
    k, r = divmod(len(items), parts)
    bounds = [i * k + min(i, r) for i in range(parts + 1)]
    return [items[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


class RolloutProducer:
    def __init__(self, engine: RolloutEngine, reward: RewardFn, tokenizer,
                 params: SamplingParams, group_size: int, recorder: SpanRecorder):
        self.engine, self.reward, self.tok, self.params = engine, reward, tokenizer, params
        self.group_size, self.rec = group_size, recorder

    def _decode(self, completion) -> str:
        return self.tok.decode(completion.token_ids, skip_special_tokens=True)

    def produce(self, step: int, problems: list[Problem], seed: int) -> list[list[Sample]]:
        g = self.group_size
        owners = [p for p in problems for _ in range(g)]
        batch = [encode_prompt(self.tok, p.prompt) for p in owners]
        version = self.engine.weight_version()
        # A streaming reward (a pool) scores each completion while the rest still generate;
        # submit returns None, so the callback never stops generation.
        stream = getattr(self.reward, "streaming", False)
        done_s: list[float | None] = [None] * len(batch)

        def on_complete(i, c) -> None:
            done_s[i] = time.monotonic() - start
            if stream:
                self.reward.submit(i, owners[i], self._decode(c), c.finished)

        with self.rec.phase("rollout", step, version):
            start = time.monotonic()
            outs = self.engine.generate(batch, self.params, seed=seed, on_complete=on_complete)
        with self.rec.phase("reward", step, version):
            texts = [self._decode(o) for o in outs]
            if stream:
                verdicts = self.reward.collect(len(outs))
            else:
                verdicts = self.reward.verdicts(owners, texts, [o.finished for o in outs])
        samples = [
            Sample(problem=owners[i], prompt_ids=batch[i], response_ids=o.token_ids,
                   behaviour_logprobs=o.logprobs, finished=o.finished, version=o.version,
                   group=i // g, text=texts[i], reward=verdicts[i].reward,
                   reason=verdicts[i].reason, gen_s=done_s[i], routing=o.routing)
            for i, o in enumerate(outs)
        ]
        return [samples[i:i + g] for i in range(0, len(samples), g)]


class TrajectoryProducer:
    """A multi-turn task's experience: one trajectory per row of a group
    (engine.rollout.multiturn), its reward the sum of its environment steps' rewards
    (no reward phase: the environment scored it as it went)."""

    def __init__(self, runner: TrajectoryRunner, group_size: int):
        self.runner, self.group_size = runner, group_size

    def produce(self, step: int, problems: list[Problem], seed: int) -> list[list[Sample]]:
        g = self.group_size
        samples = self.runner.samples(self.runner.run(problems, g, seed, step))
        return [samples[i:i + g] for i in range(0, len(samples), g)]
