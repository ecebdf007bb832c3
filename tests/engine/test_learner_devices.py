"""How the learner computes (device, precision, micro-batches, packing) leaves what it
computes unchanged: the same loss, gradients and step as the plain padded fp32 batch.

Tolerances. Losses and the accumulated gradients the optimizer steps on agree to the fp32
rounding of different summation orders (~3e-8 here; asserted 1e-6), and so do the updated
weights (1e-6) wherever AdamW's step is well conditioned. Its first step is
lr * g / (|g| + eps), eps = 1e-8: for the few hundred weights whose gradient is itself ~1e-8
(|g| < 1e-6), a rounding dg of g moves the step by up to lr * |dg| / eps, which is all
one may ask of them.
"""

import dataclasses

import pytest
import torch

from engine.config import GrpoConfig, LearnerConfig, validate_config
from engine.experience import Sample
from engine.learner.batch import (
    micro_batches,
    pack,
    packed_layout,
    padded_layout,
    response_logprobs,
    shared_layout,
    shares_prompts,
)
from engine.learner.device import DeviceUnavailableError, resolve_device
from engine.learner.learner import Learner
from engine.model import load_policy, load_tokenizer
from engine.rollout.base import SamplingParams
from engine.rollout.torch_backend import TorchRollout
from engine.tasks import Problem
from engine.weightsync.fingerprint import fingerprint


@pytest.fixture(scope="module")
def ragged_batch(tiny_dir):
    """16 samples with prompts of 2..11 tokens and responses of 1..9."""
    tok = load_tokenizer(tiny_dir)
    engine = TorchRollout.from_pretrained(tiny_dir)
    texts = ["1=", "12+3=", "rev:abcdefg=", "4*5="]
    prompts = [tok(p)["input_ids"] for p in texts for _ in range(4)]
    outs = engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=9), seed=0)
    samples = [Sample(Problem("", ""), p, o.token_ids, o.logprobs, o.finished, 0, i // 4,
                      advantage=(1.0 if i % 2 else -1.0))
               for i, (p, o) in enumerate(zip(prompts, outs, strict=True))]
    assert len({len(s.response_ids) for s in samples}) > 1     # ragged, or nothing to pack
    return pack(samples, tok.pad_token_id)


def one_update(tiny_dir, batch, setup: LearnerConfig, **grpo):
    """Metrics, the accumulated gradients at the optimizer step, and the updated weights."""
    cfg = GrpoConfig(**{"minibatches": 1, **grpo})
    reference = load_policy(tiny_dir) if cfg.kl_coef > 0 else None
    learner = Learner(load_policy(tiny_dir), cfg, 0.7, seed=0, reference=reference, setup=setup)
    grads, step = {}, learner.optimizer.step

    def capture_then_step():
        grads.update({n: p.grad.clone() for n, p in learner.policy.named_parameters()})
        step()

    learner.optimizer.step = capture_then_step
    metrics = learner.update(batch)
    return metrics, grads, dict(learner.named_tensors()), learner


def max_diff(a: dict, b: dict) -> float:
    return max(float((a[k].detach() - b[k].detach()).abs().max()) for k in a)


def assert_same_adamw_step(a, b, lr: float = GrpoConfig().lr, eps: float = 1e-8) -> None:
    """``a``, ``b``: one_update results from the same start. Same gradients, and the same
    updated weights up to AdamW's conditioning (module docstring)."""
    assert max_diff(a[1], b[1]) < 1e-6
    for name, g in a[1].items():
        dw = (a[2][name] - b[2][name]).abs()
        well = g.abs() > 1e-6
        assert float(torch.where(well, dw, 0.0).max()) < 1e-6, name
        bound = lr * (g - b[1][name]).abs() / eps + 1e-7
        assert bool((dw[~well] <= bound[~well]).all()), name


def test_micro_batches_split_by_token_budget_and_keep_row_order():
    costs = [5, 9, 4, 30]                                       # by row
    runs = micro_batches(torch.tensor([3, 0, 2, 1]), costs, budget=10)
    assert [r.tolist() for r in runs] == [[3], [0, 2], [1]]     # 3 alone: over the budget
    assert [r.tolist() for r in micro_batches(torch.arange(3), [1, 1, 1], 0)] == [[0, 1, 2]]


@pytest.mark.parametrize("packing", [False, True])
def test_micro_batched_accumulation_equals_one_big_batch(tiny_dir, ragged_batch, packing):
    whole = one_update(tiny_dir, ragged_batch, LearnerConfig(packing=packing))
    split_setup = LearnerConfig(packing=packing, micro_batch_tokens=40)
    split = one_update(tiny_dir, ragged_batch, split_setup)
    n_micro = len(split[3]._micro_batches(ragged_batch, torch.arange(len(ragged_batch))))
    assert n_micro >= 4

    assert split[0]["learner/loss"] == pytest.approx(whole[0]["learner/loss"], abs=1e-6)
    assert split[0]["learner/entropy"] == pytest.approx(whole[0]["learner/entropy"], abs=1e-6)
    before = dict(load_policy(tiny_dir).named_parameters())
    assert max_diff(whole[2], before) > 5e-5                    # the step did move weights
    assert_same_adamw_step(split, whole)


def test_micro_batches_weight_the_kl_and_every_minibatch_like_the_whole(tiny_dir, ragged_batch):
    grpo = {"kl_coef": 0.1, "minibatches": 2}
    whole = one_update(tiny_dir, ragged_batch, LearnerConfig(packing=False), **grpo)
    split = one_update(tiny_dir, ragged_batch,
                       LearnerConfig(packing=False, micro_batch_tokens=30), **grpo)
    for key in ("learner/loss", "learner/kl_ref", "learner/clip_frac", "learner/grad_norm"):
        assert split[0][key] == pytest.approx(whole[0][key], abs=1e-6), key
    assert whole[0]["learner/kl_ref"] > 0


@pytest.mark.parametrize("mode", ["seq-mean-token-sum", "seq-mean-token-mean",
                                  "seq-mean-token-sum-norm"])
def test_every_loss_aggregation_accumulates_over_micro_batches_like_the_whole(
        tiny_dir, ragged_batch, mode):
    whole = one_update(tiny_dir, ragged_batch, LearnerConfig(packing=False), loss_agg_mode=mode)
    split = one_update(tiny_dir, ragged_batch,
                       LearnerConfig(packing=False, micro_batch_tokens=30), loss_agg_mode=mode)
    assert split[0]["learner/loss"] == pytest.approx(whole[0]["learner/loss"], abs=1e-6)
    assert_same_adamw_step(split, whole)


def test_a_sequence_masked_out_of_the_loss_trains_like_an_absent_one(tiny_dir, ragged_batch):
    masked = dataclasses.replace(ragged_batch, in_loss=(torch.arange(16) >= 4).float())
    absent = ragged_batch.select(torch.arange(4, 16))
    a = one_update(tiny_dir, masked, LearnerConfig(packing=False),
                   loss_agg_mode="seq-mean-token-mean")
    b = one_update(tiny_dir, absent, LearnerConfig(packing=False),
                   loss_agg_mode="seq-mean-token-mean")
    assert a[0]["learner/loss"] == pytest.approx(b[0]["learner/loss"], abs=1e-6)
    assert max_diff(a[1], b[1]) < 1e-6


def test_packed_rows_hold_several_sequences_and_give_the_padded_logprobs(tiny_dir, ragged_batch):
    padded, packed = padded_layout(ragged_batch), packed_layout(ragged_batch, row_tokens=40)
    assert packed.tokens < padded.tokens
    assert packed.input_ids.shape[0] < len(ragged_batch)
    # positions restart at every sequence inside a packed row
    assert int((packed.position_ids == 0).sum()) >= len(ragged_batch)

    model = load_policy(tiny_dir).eval()
    mask = ragged_batch.response_mask.bool()
    with torch.no_grad():
        lp_pad, ent_pad = response_logprobs(model, ragged_batch, 0.7, with_entropy=True)
        for rows in (40, 256):          # several packed rows; all sequences in one row
            lp, ent = response_logprobs(model, ragged_batch, 0.7, with_entropy=True,
                                        packed=True, row_tokens=rows)
            assert (lp - lp_pad).abs()[mask].max() < 1e-5
            assert (ent - ent_pad).abs()[mask].max() < 1e-5
            assert float(lp[~mask].abs().max()) == 0.0


def test_a_groups_prompt_is_computed_once_and_gives_each_row_its_own_logprobs(
        tiny_dir, ragged_batch):
    """4 prompts x 4 responses: the shared layout holds each prompt once per segment (all
    four responses after it where they fit): fewer slots than packing, and the padded
    rows' logprobs and entropies for every response token."""
    model = load_policy(tiny_dir).eval()
    assert shares_prompts(model)
    mask = ragged_batch.response_mask.bool()
    with torch.no_grad():
        lp_pad, ent_pad = response_logprobs(model, ragged_batch, 0.7, with_entropy=True)
    for rows in (16, 40, 256):         # a group split over segments; a group per row; all
        shared = shared_layout(ragged_batch, row_tokens=rows)
        assert shared.tokens < packed_layout(ragged_batch, row_tokens=rows).tokens
        with torch.no_grad():
            lp, ent = response_logprobs(model, ragged_batch, 0.7, with_entropy=True,
                                        packed=True, row_tokens=rows)
        assert (lp - lp_pad).abs()[mask].max() < 1e-5
        assert (ent - ent_pad).abs()[mask].max() < 1e-5
    windowed = load_policy(tiny_dir)
    windowed.config.sliding_window = 4            # a custom mask would drop the window
    assert not shares_prompts(windowed)


def test_a_packed_update_equals_the_padded_one(tiny_dir, ragged_batch):
    padded = one_update(tiny_dir, ragged_batch, LearnerConfig(packing=False))
    packed = one_update(tiny_dir, ragged_batch, LearnerConfig(packing=True))
    assert packed[0]["learner/loss"] == pytest.approx(padded[0]["learner/loss"], abs=1e-6)
    assert packed[0]["logprob_gap/mean"] == pytest.approx(padded[0]["logprob_gap/mean"],
                                                          abs=1e-6)
    assert_same_adamw_step(packed, padded)


def test_gradient_checkpointing_changes_memory_not_the_step(tiny_dir, ragged_batch):
    plain = one_update(tiny_dir, ragged_batch, LearnerConfig())
    ckpt = one_update(tiny_dir, ragged_batch, LearnerConfig(gradient_checkpointing=True))
    assert ckpt[3].policy.model.gradient_checkpointing
    assert ckpt[0]["learner/loss"] == pytest.approx(plain[0]["learner/loss"], abs=1e-6)
    assert_same_adamw_step(ckpt, plain)


def test_bf16_autocast_runs_on_cpu_within_a_stated_tolerance_of_fp32(tiny_dir, ragged_batch):
    """bf16 keeps 8 bits of mantissa: logprobs within 0.05 nats per token and the loss
    within 1e-3 of fp32 (measured ~0.01 and ~2e-4 here); weights and AdamW state fp32."""
    fp32 = one_update(tiny_dir, ragged_batch, LearnerConfig())
    bf16 = one_update(tiny_dir, ragged_batch, LearnerConfig(precision="bf16"))
    assert bf16[0]["learner/loss"] == pytest.approx(fp32[0]["learner/loss"], abs=1e-3)
    learner = bf16[3]
    assert all(p.dtype == torch.float32 for p in learner.policy.parameters())
    state = next(iter(learner.optimizer.state.values()))
    assert state["exp_avg"].dtype == torch.float32
    mask = ragged_batch.response_mask.bool()
    with torch.no_grad():
        lp16 = learner.logprobs(learner.policy, ragged_batch, 0.7)[0]
        lp32 = fp32[3].logprobs(fp32[3].policy, ragged_batch, 0.7)[0]
    gap = (lp16 - lp32).abs()[mask]
    assert 0 < float(gap.mean()) < 0.05      # > 0: bf16 did run


def test_cuda_on_a_machine_without_it_is_refused_naming_the_field(tiny_dir, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(DeviceUnavailableError) as err:
        Learner(load_policy(tiny_dir), GrpoConfig(), 1.0, seed=0,
                setup=LearnerConfig(device="cuda"))
    message = str(err.value)
    assert 'learner.device = "cuda"' in message
    assert 'set learner.device = "auto"' in message and '"cpu"' in message


def test_auto_trains_on_the_cpu_without_cuda_and_the_fingerprint_is_the_weights(
        tiny_dir, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    learner = Learner(load_policy(tiny_dir), GrpoConfig(), 1.0, seed=0)
    cpu_copy = [(n, t.to("cpu", copy=True)) for n, t in learner.named_tensors()]
    assert learner.fingerprint() == fingerprint(cpu_copy)


def test_the_run_config_has_a_learner_section_that_refuses_unknown_keys():
    cfg = validate_config({"learner": {"device": "cpu", "precision": "bf16",
                                       "micro_batch_tokens": 4096}})
    assert cfg.learner.precision == "bf16" and cfg.learner.packing
    from engine.config import ConfigError

    with pytest.raises(ConfigError, match="learner.micro_batch_tokens"):
        validate_config({"learner": {"micro_batch_tokens": -1}})
    with pytest.raises(ConfigError, match="learner.dtype"):
        validate_config({"learner": {"dtype": "fp16"}})
