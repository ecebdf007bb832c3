"""Produces a step's experience: prompts -> rollout engine -> reward -> groups.

    problems = task.train_problems(step, prompts_per_step)
    each prompt x group_size -> engine.generate(...)        [span: rollout]
        a streaming reward (a pool) gets each completion as it finishes (on_complete)
    decode, reward.score(...) or pool.collect(...)          [span: reward]
    -> one group (list[Sample]) per prompt, tagged with the engine's weight version
"""

from __future__ import annotations

from engine.experience import Sample
from engine.orchestration.placement import Layout
from engine.reward import RewardFn
from engine.reward.service import RewardService
from engine.rollout.base import RolloutEngine, SamplingParams
from engine.tasks import Task
from engine.telemetry.recorder import Telemetry


def step_seed(seed: int, step: int) -> int:
    return (seed * 1_000_003 + step * 7_919 + 1) % (2**63 - 1)


class RolloutProducer:
    def __init__(self, engine: RolloutEngine, task: Task, reward: RewardFn, tokenizer,
                 params: SamplingParams, prompts_per_step: int, group_size: int, seed: int,
                 layout: Layout, telemetry: Telemetry):
        self.engine, self.task, self.reward, self.tok = engine, task, reward, tokenizer
        self.params, self.n_prompts, self.group_size = params, prompts_per_step, group_size
        self.seed, self.layout, self.tel = seed, layout, telemetry

    def _decode(self, completion) -> str:
        return self.tok.decode(completion.token_ids, skip_special_tokens=True)

    def produce(self, step: int) -> list[list[Sample]]:
        problems = self.task.train_problems(step, self.n_prompts)
        prompt_ids = [self.tok(p.prompt)["input_ids"] for p in problems]
        batch = [ids for ids in prompt_ids for _ in range(self.group_size)]
        version = self.engine.weight_version()
        owners = [p for p in problems for _ in range(self.group_size)]
        stream = isinstance(self.reward, RewardService) and self.reward.streaming
        on_complete = ((lambda i, c: self.reward.submit(i, owners[i], self._decode(c), c.finished))
                       if stream else None)
        with self.tel.phase("rollout", self.layout.rollout, step, version):
            outs = self.engine.generate(batch, self.params, seed=step_seed(self.seed, step),
                                        on_complete=on_complete)
        with self.tel.phase("reward", self.layout.rollout, step, version):
            texts = [self._decode(o) for o in outs]
            if stream:
                rewards = [v.reward for v in self.reward.collect(len(outs))]
            else:
                rewards = self.reward.score(owners, texts, [o.finished for o in outs])
        samples = [
            Sample(problem=owners[i], prompt_ids=batch[i], response_ids=o.token_ids,
                   behaviour_logprobs=o.logprobs, finished=o.finished, version=o.version,
                   group=i // self.group_size, text=texts[i], reward=rewards[i])
            for i, o in enumerate(outs)
        ]
        g = self.group_size
        return [samples[i:i + g] for i in range(0, len(samples), g)]
