import math

import pytest
import torch

from engine.experience import overlong_penalty
from engine.learner.losses import (
    advantages,
    aggregate,
    clipped_surrogate,
    group_advantages,
    k3,
    masked_mean,
    reinforce_pp_advantages,
    rloo_advantages,
    tis_weights,
    token_weights,
)


def test_group_advantages_are_normalized_within_each_group():
    r = torch.tensor([1.0, 0.0, 1.0, 0.0, 5.0, 5.0, 5.0, 5.0])
    adv = group_advantages(r, group_size=4, normalize_std=True)
    assert torch.allclose(adv[:4], torch.tensor([1.0, -1.0, 1.0, -1.0]), atol=1e-4)
    assert torch.equal(adv[4:], torch.zeros(4))       # a solved group teaches nothing
    centered = group_advantages(r, group_size=4, normalize_std=False)
    assert torch.allclose(centered[:4], torch.tensor([0.5, -0.5, 0.5, -0.5]))


def test_k3_is_zero_for_equal_policies_and_positive_otherwise():
    p = torch.log(torch.tensor([0.2, 0.5, 0.9]))
    assert torch.allclose(k3(p, p), torch.zeros(3))
    q = torch.log(torch.tensor([0.3, 0.4, 0.8]))
    assert (k3(p, q) > 0).all()
    # r = 0.3/0.2 = 1.5 -> 0.5 - log 1.5
    assert math.isclose(float(k3(p, q)[0]), 0.5 - math.log(1.5), rel_tol=1e-5)


def test_tis_weights_are_capped_and_report_the_clipped_tokens():
    behaviour = torch.log(torch.tensor([0.5, 0.1, 0.5]))
    learner = torch.log(torch.tensor([0.5, 0.5, 0.25]))
    w, clipped = tis_weights(learner, behaviour, cap=2.0)
    assert torch.allclose(w, torch.tensor([1.0, 2.0, 0.5]))
    assert clipped.tolist() == [False, True, False]


def test_clipped_surrogate_takes_the_pessimistic_branch():
    old = torch.zeros(4)
    new = torch.log(torch.tensor([1.5, 1.5, 0.5, 0.5]))
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    obj, clipped = clipped_surrogate(new, old, adv, clip_low=0.2)
    assert torch.allclose(obj, torch.tensor([1.2, -1.5, 0.5, -0.8]))
    assert clipped.tolist() == [True, False, False, True]


def test_clip_higher_lets_a_positive_advantage_ratio_grow_further_than_it_may_shrink():
    old = torch.zeros(4)
    new = torch.log(torch.tensor([1.25, 1.4, 0.7, 0.7]))
    adv = torch.tensor([1.0, 1.0, -1.0, 1.0])
    obj, clipped = clipped_surrogate(new, old, adv, clip_low=0.2, clip_high=0.28)
    # 1.25 < 1 + 0.28 stays; 1.4 clips to 1.28; 0.7 clips to 1 - 0.2 = 0.8 for A < 0 (the
    # pessimistic branch: -0.8 < -0.7); for A > 0 the unclipped 0.7 is the smaller one.
    assert torch.allclose(obj, torch.tensor([1.25, 1.28, -0.8, 0.7]))
    assert clipped.tolist() == [False, True, True, False]


# Two sequences with tokens (3 and 1) and one masked out of the loss (overlong filter).
PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [9.0, 9.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])


@pytest.mark.parametrize(("mode", "expected"), [
    ("token-mean", (1 + 2 + 3 + 4) / 4),                     # every token alike
    ("seq-mean-token-sum", ((1 + 2 + 3) + 4) / 2),           # sums, averaged over sequences
    ("seq-mean-token-mean", ((1 + 2 + 3) / 3 + 4 / 1) / 2),  # means, averaged over sequences
    ("seq-mean-token-sum-norm", ((1 + 2 + 3) + 4) / (2 * 8)),  # sums / (S x max_new_tokens)
])
def test_each_loss_aggregation_matches_its_formula(mode, expected):
    assert float(aggregate(PER_TOKEN, MASK, mode, norm_tokens=8)) == pytest.approx(expected)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean",
                                  "seq-mean-token-sum-norm"])
def test_weights_fixed_by_the_minibatch_sum_to_its_loss_over_any_row_split(mode):
    w = token_weights(MASK, mode, norm_tokens=8)
    parts = sum(float((PER_TOKEN[rows] * w[rows]).sum()) for rows in ([0], [1, 2]))
    assert parts == pytest.approx(float(aggregate(PER_TOKEN, MASK, mode, norm_tokens=8)))


REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0])      # two groups of K = 4


def test_grpo_advantages_are_the_group_z_score():
    std2 = math.sqrt(0.75 * 0.25)                        # population std of {1, 1, 1, 0}
    expected = [1, -1, -1, 1, 0.25 / std2, 0.25 / std2, 0.25 / std2, -0.75 / std2]
    adv = advantages("grpo", REWARDS, torch.ones(8), group_size=4)
    assert torch.allclose(adv, torch.tensor(expected), atol=1e-4)


def test_rloo_advantage_is_the_reward_minus_the_mean_of_the_others():
    expected = [1 - 1 / 3, 0 - 2 / 3, 0 - 2 / 3, 1 - 1 / 3, 1 - 2 / 3, 1 - 2 / 3, 1 - 2 / 3, 0 - 1]
    assert torch.allclose(rloo_advantages(REWARDS, 4), torch.tensor(expected))
    assert torch.allclose(advantages("rloo", REWARDS, torch.ones(8), 4), torch.tensor(expected))


def test_reinforce_pp_whitens_returns_over_every_token_of_the_batch():
    rewards, lengths = torch.tensor([1.0, 0.0, 2.0]), torch.tensor([1, 2, 1])
    # token returns (gamma 1, outcome reward): [1 | 0 0 | 2]: mean 3/4, unbiased variance
    # (0.25^2 + 2 x 0.75^2 + 1.25^2) / 3 = 2.75 / 3
    std = math.sqrt(2.75 / 3)
    expected = [0.25 / std, -0.75 / std, 1.25 / std]
    assert torch.allclose(reinforce_pp_advantages(rewards, lengths), torch.tensor(expected),
                          atol=1e-6)
    assert torch.allclose(advantages("reinforce_pp", rewards, lengths, group_size=3),
                          torch.tensor(expected), atol=1e-6)


def test_the_soft_overlong_penalty_falls_linearly_over_the_buffer():
    # max_new_tokens 10, buffer 4: free up to 6 tokens, -factor at 10
    assert [overlong_penalty(n, 10, 4, 1.0) for n in (3, 6, 8, 10)] == [0.0, 0.0, -0.5, -1.0]
    assert overlong_penalty(9, 10, 4, 0.5) == pytest.approx(-0.375)


def test_masked_mean_ignores_padding():
    x = torch.tensor([[1.0, 3.0, 100.0]])
    m = torch.tensor([[1.0, 1.0, 0.0]])
    assert float(masked_mean(x, m)) == 2.0
