"""Every seed a run derives from ``model.seed``, in one place.

    seed_everything(seed)          python, numpy and torch global RNGs (each process)
    step_seed(seed, step)          the sampling seed of a step (sync) or a draw (streaming);
                                   step -1 is the held-out eval
    worker_seed(seed, index, w)    rollout worker w's share of step/draw ``index``
    resample_seed(seed, step, r, w)  its share of dynamic sampling's extra round r of a step
    minibatch_seed(seed, step)     the learner's minibatch shuffle at update ``step``

A resumed run recomputes the same seeds from (seed, step), so it samples and shuffles as
the uninterrupted run would have.
"""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def step_seed(seed: int, step: int) -> int:
    return (seed * 1_000_003 + step * 7_919 + 1) % (2**63 - 1)


def worker_seed(seed: int, index: int, worker: int) -> int:
    return step_seed(seed, index) + worker


def resample_seed(seed: int, step: int, round_: int, worker: int) -> int:
    return (step_seed(seed, step) * 1_009 + round_ * 131 + worker) % (2**63 - 1)


def minibatch_seed(seed: int, step: int) -> int:
    return seed * 1_000_003 + step
