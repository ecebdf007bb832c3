"""Async policies: when rollouts run relative to learner updates.

The driver's loop is fixed -- ``groups = policy.next_batch(step, learner_version)``, then
learner update, then weight sync. A policy decides where those groups come from:

    sync            produce(step) with the current weights, train on it   (staleness 0)
    one-step-off    (later) produce(step+1) while the learner trains on step
    fully async     (later) producers fill the buffer; take() enforces the staleness bound
"""

from __future__ import annotations

from typing import Protocol

from engine.experience import ExperienceBuffer, Sample
from engine.orchestration.producer import RolloutProducer


class AsyncPolicy(Protocol):
    name: str

    def next_batch(self, step: int, learner_version: int) -> list[list[Sample]]: ...

    def close(self) -> None: ...


class SyncPolicy:
    name = "sync"

    def __init__(self, producer: RolloutProducer, buffer: ExperienceBuffer):
        self.producer, self.buffer = producer, buffer

    def next_batch(self, step: int, learner_version: int) -> list[list[Sample]]:
        for group in self.producer.produce(step):
            self.buffer.put(group)
        return self.buffer.take(self.producer.n_prompts, learner_version)

    def close(self) -> None:
        pass
