"""The metrics the output rules read, on tiny inputs: the importance ratios and the
effective sample size of a batch, the repetition score, and the faults that move them."""

import pytest
import torch

from engine.config import validate_config
from engine.faults import sharpen_policy, wrap_rollout
from engine.learner.learner import importance_metrics
from engine.rollout.base import Completion, SamplingParams
from engine.telemetry.step_metrics import repetition

MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])       # (B, R)
ADV = torch.tensor([[1.0] * 4, [-1.0] * 4])


def test_on_policy_tokens_keep_the_whole_batch():
    logp = torch.full((2, 4), -1.0)
    m = importance_metrics(logp, logp, ADV, MASK, cap=2.0)
    assert m["tis/ratio_mean"] == m["tis/ratio_min"] == m["tis/ratio_p01"] == 1.0
    assert m["tis/ess"] == pytest.approx(1.0) and m["tis/ess_ratio"] == pytest.approx(1.0)
    assert m["tis/clip_frac"] == 0.0


def test_a_few_tokens_with_weight_leave_a_small_effective_sample():
    learner = torch.full((2, 4), -1.0)
    behaviour = learner + 5.0                     # weights e^-5 ...
    behaviour[0, 0] = -1.0                        # ... but one token's is 1
    m = importance_metrics(learner, behaviour, ADV, MASK, cap=2.0)
    assert m["tis/ratio_min"] == pytest.approx(torch.exp(torch.tensor(-5.0)).item())
    assert m["tis/ess"] < 0.2 and m["tis/ess_ratio"] < 0.2
    # no token carries an advantage: nothing to weigh, no ESS
    assert "tis/ess" not in importance_metrics(learner, behaviour, ADV * 0, MASK, cap=2.0)


def test_repetition_is_the_share_of_repeated_ngrams():
    assert repetition(list(range(10))) == 0.0
    assert repetition([7, 8, 9] * 10) == pytest.approx(1 - 3 / 27)
    assert repetition([1, 2, 3]) == 0.0


class Echo:
    """A rollout engine at its seam: one completion per prompt, logprob -1 per token,
    stopping at EOS unless told not to."""

    def generate(self, prompts, params, seed, on_complete=None, budgets=None):
        n = params.max_new_tokens if params.ignore_eos else 2
        return [Completion(list(range(n)), [-1.0] * n, not params.ignore_eos, 0)
                for _ in prompts]


def test_the_output_faults_act_from_their_step():
    faults = validate_config({"faults": {"importance_collapse": {"from_step": 2, "share": 1.0},
                                         "no_stop": {"from_step": 2}}}).faults
    step = 1
    engine = wrap_rollout(Echo(), faults, lambda: step)
    params = SamplingParams(max_new_tokens=6)
    [before] = engine.generate([[1]], params, seed=0)
    step = 2
    [after] = engine.generate([[1]], params, seed=0)
    assert (before.logprobs, before.finished) == ([-1.0, -1.0], True)
    assert after.logprobs == [4.0] * 6 and not after.finished


def test_entropy_collapse_sharpens_the_output_head_once():
    head = torch.nn.Linear(2, 3, bias=False)

    class Policy(torch.nn.Module):
        def get_output_embeddings(self):
            return head

    faults = validate_config({"faults": {"entropy_collapse": {"at_step": 3,
                                                              "factor": 10.0}}}).faults
    weight = head.weight.detach().clone()
    for step in range(5):
        sharpen_policy(Policy(), faults, step)
    assert torch.allclose(head.weight, weight * 10.0)
