import math

import torch

from engine.learner.losses import clipped_surrogate, group_advantages, k3, masked_mean, tis_weights


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
    obj, clipped = clipped_surrogate(new, old, adv, clip_eps=0.2)
    assert torch.allclose(obj, torch.tensor([1.2, -1.5, 0.5, -0.8]))
    assert clipped.tolist() == [True, False, False, True]


def test_masked_mean_ignores_padding():
    x = torch.tensor([[1.0, 3.0, 100.0]])
    m = torch.tensor([[1.0, 1.0, 0.0]])
    assert float(masked_mean(x, m)) == 2.0
