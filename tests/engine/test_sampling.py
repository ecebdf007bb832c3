"""The sampling distribution (engine.sampling) the torch sampler draws from and the learner
recomputes: vLLM's processed logprobs, written once."""

import pytest
import torch

from engine.sampling import entropy, outside_top_p, processed_logprobs


def test_top_p_keeps_the_smallest_set_holding_top_p_of_the_mass():
    logits = torch.log(torch.tensor([[0.15, 0.5, 0.05, 0.3]]))
    assert outside_top_p(logits, 0.75).tolist() == [[True, False, True, False]]
    assert outside_top_p(logits, 0.81).tolist() == [[False, False, True, False]]
    assert outside_top_p(logits, 0.01).tolist() == [[True, False, True, True]]


def test_processed_logprobs_renormalize_over_the_nucleus():
    logits = torch.log(torch.tensor([[0.15, 0.5, 0.05, 0.3]]))
    logp = processed_logprobs(logits, temperature=1.0, top_p=0.75)
    assert torch.allclose(logp.exp(), torch.tensor([[0.0, 0.625, 0.0, 0.375]]))
    assert torch.equal(processed_logprobs(logits, 0.7, 1.0), torch.log_softmax(logits / 0.7, -1))


def test_the_kept_token_stays_in_the_nucleus_and_takes_its_share():
    logits = torch.log(torch.tensor([[0.15, 0.5, 0.05, 0.3]]))
    logp = processed_logprobs(logits, 1.0, 0.75, keep=torch.tensor([0]))
    assert torch.allclose(logp.exp(), torch.tensor([[0.15, 0.5, 0.0, 0.3]]) / 0.95)


def test_gradients_and_entropy_stay_finite_with_dropped_tokens():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0)) * 3
    logits.requires_grad_(True)
    keep = torch.arange(6)
    logp = processed_logprobs(logits, 0.7, 0.5, keep=keep)
    assert torch.isinf(logp).any()                       # the test drops something
    picked = logp.gather(-1, keep[:, None])
    (picked.sum() + entropy(logp).sum()).backward()
    assert torch.isfinite(picked).all() and torch.isfinite(entropy(logp)).all()
    assert torch.isfinite(logits.grad).all()


@pytest.mark.vllm
def test_the_nucleus_is_vllms():
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    gen = torch.Generator().manual_seed(0)
    for scale in (0.5, 2.0, 6.0):
        logits = torch.randn(64, 300, generator=gen) * scale
        for p in (0.3, 0.9, 0.99):
            theirs = apply_top_k_top_p_pytorch(logits.clone(), None, torch.full((64,), p))
            assert torch.equal(outside_top_p(logits, p), torch.isinf(theirs))
            assert torch.equal(processed_logprobs(logits, 1.0, p), torch.log_softmax(theirs, -1))
