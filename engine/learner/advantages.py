"""Each sample's advantage, set in the driver before the update, where the inspector reads it:

    GRPO   adv = advantages(algorithm.adv_estimator, learning rewards, lengths, group_size)
                 (engine.learner.losses: grpo, rloo, reinforce_pp), one per completion
    PPO    none here: its critic's values and GAE give them, in the learner or on the
           critic's own bundle (engine.learner.ppo)
"""

from __future__ import annotations

import torch

from engine.config import AlgorithmConfig, GrpoConfig
from engine.experience import Sample
from engine.learner.losses import advantages


def assign_advantages(samples: list[Sample], alg: AlgorithmConfig) -> None:
    """GRPO's advantages into ``samples`` (ordered group by group), from their learning
    rewards (reward + shaping); nothing for PPO."""
    if not isinstance(alg, GrpoConfig):
        return
    adv = advantages(alg.adv_estimator,
                     torch.tensor([s.learning_reward for s in samples]),
                     torch.tensor([len(s.response_ids) for s in samples]),
                     alg.group_size, alg.normalize_std)
    for s, a in zip(samples, adv.tolist(), strict=True):
        s.advantage = a
