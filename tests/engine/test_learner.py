import copy

import pytest
import torch

from engine.config import GrpoConfig, LearnerConfig, validate_config
from engine.experience import Sample
from engine.learner.batch import pack
from engine.learner.learner import Learner
from engine.model import load_policy, load_tokenizer
from engine.rollout.base import SamplingParams
from engine.rollout.torch_backend import TorchRollout
from engine.tasks import Problem


@pytest.fixture(scope="module")
def rollout_batch(tiny_dir):
    tok = load_tokenizer(tiny_dir)
    engine = TorchRollout.from_pretrained(tiny_dir)
    prompts = [tok(p)["input_ids"] for p in ["12+3=", "4*5=", "rev:ab="] for _ in range(4)]
    outs = engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=5), seed=0)
    samples = [Sample(Problem("", ""), p, o.token_ids, o.logprobs, o.finished, 0, i // 4,
                      advantage=(1.0 if i % 2 else -1.0))
               for i, (p, o) in enumerate(zip(prompts, outs, strict=True))]
    return samples, tok.pad_token_id


def test_behaviour_logprobs_from_the_same_weights_give_no_gap_and_no_tis_clipping(
        tiny_dir, rollout_batch):
    samples, pad = rollout_batch
    learner = Learner(load_policy(tiny_dir), GrpoConfig(), 1.0, seed=0)
    m = learner.update(pack(samples, pad))
    assert m["logprob_gap/max"] < 1e-4 and m["tis/clip_frac"] == 0.0


def test_mis_scaled_behaviour_logprobs_show_up_as_gap_and_tis_clipping(tiny_dir, rollout_batch):
    samples, pad = rollout_batch
    skewed = [copy.copy(s) for s in samples]
    for s in skewed:                       # the engine claims each token was 20x less likely
        s.behaviour_logprobs = [lp - 3.0 for lp in s.behaviour_logprobs]
    learner = Learner(load_policy(tiny_dir), GrpoConfig(tis_cap=2.0), 1.0, seed=0)
    m = learner.update(pack(skewed, pad))
    assert m["logprob_gap/mean"] == pytest.approx(3.0, abs=1e-3)
    assert m["tis/clip_frac"] == 1.0
    assert m["logprob_gap/k3"] > 1.0


def test_kl_to_the_reference_starts_at_zero_and_grows(tiny_dir, rollout_batch):
    samples, pad = rollout_batch
    cfg = GrpoConfig(kl_coef=0.1, lr=1e-2, minibatches=1)
    learner = Learner(load_policy(tiny_dir), cfg, 1.0, seed=0, reference=load_policy(tiny_dir))
    kls = [learner.update(pack(samples, pad))["learner/kl_ref"] for _ in range(3)]
    assert kls[0] == pytest.approx(0.0, abs=1e-9)
    assert kls[2] > 1e-4


def test_every_epoch_and_minibatch_is_an_optimizer_step(tiny_dir, rollout_batch):
    samples, pad = rollout_batch
    learner = Learner(load_policy(tiny_dir), GrpoConfig(epochs=2, minibatches=3), 1.0, seed=0)
    before = {n: p.detach().clone() for n, p in learner.policy.named_parameters()}
    learner.update(pack(samples, pad))
    state = next(iter(learner.optimizer.state.values()))
    assert int(state["step"]) == 6
    assert learner.version == 1 and learner.step == 1
    assert any(not torch.equal(before[n], p) for n, p in learner.policy.named_parameters())


def test_a_warm_start_cut_short_by_its_time_bound_is_not_cached_as_the_full_one(model_cache):
    import json

    from engine.learner.warmstart import ensure_warm_start

    settings = {"steps": 3, "batch_size": 2, "lr": 0.0123}      # a key no other test uses
    logs: list[str] = []
    cut = ensure_warm_start(validate_config({"warm_start": {**settings, "max_seconds": 1e-9}}),
                            log=logs.append)
    assert json.loads((cut / "warmstart.json").read_text())["steps_done"] == 1
    assert cut.parent.name == "partial" and any("not cached" in line for line in logs)
    again = ensure_warm_start(validate_config({"warm_start": {**settings, "max_seconds": 1e-9}}),
                              log=logs.append)
    assert again != cut and cut.exists()       # a run still using its copy keeps it

    full = ensure_warm_start(validate_config({"warm_start": settings}), log=logs.append)

    assert full != cut and full.parent == cut.parent.parent
    assert json.loads((full / "warmstart.json").read_text())["steps_done"] == 3
    assert ensure_warm_start(validate_config({"warm_start": settings})) == full   # cached


def test_a_top_p_learner_recomputes_the_nucleus_the_engine_sampled_from(tiny_dir):
    tok = load_tokenizer(tiny_dir)
    engine = TorchRollout.from_pretrained(tiny_dir)
    prompts = [tok(p)["input_ids"] for p in ["12+3=", "4*5=", "rev:ab="] for _ in range(4)]
    params = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=5)
    outs = engine.generate(prompts, params, seed=0)
    samples = [Sample(Problem("", ""), p, o.token_ids, o.logprobs, o.finished, 0, i // 4,
                      advantage=(1.0 if i % 2 else -1.0))
               for i, (p, o) in enumerate(zip(prompts, outs, strict=True))]
    batch = pack(samples, tok.pad_token_id)
    cfg = GrpoConfig(kl_coef=0.1, lr=1e-2, minibatches=1)
    learner = Learner(load_policy(tiny_dir), cfg, 0.7, seed=0,
                      reference=load_policy(tiny_dir), top_p=0.9)
    steps = [learner.update(batch) for _ in range(3)]
    assert steps[0]["logprob_gap/max"] < 1e-4 and steps[0]["tis/clip_frac"] == 0.0
    assert steps[0]["learner/kl_ref"] == pytest.approx(0.0, abs=1e-9)
    assert steps[2]["learner/kl_ref"] > 1e-4          # trains, and every value stays finite
    assert all(v == v and abs(v) < float("inf") for m in steps for v in m.values())
    # The full tempered distribution instead: -log(kept mass) per token, not rounding.
    full = Learner(load_policy(tiny_dir), cfg, 0.7, seed=0).update(batch)
    assert full["logprob_gap/mean"] > 0.05


@pytest.mark.parametrize("tis_cap, minibatches, epochs",
                         [(2.0, 1, 1), (1.0 + 1e-6, 1, 1), (2.0, 2, 1), (1.0 + 1e-6, 2, 2)])
def test_the_first_optimizer_step_takes_old_logprobs_from_its_own_forward_with_the_same_update(
        tiny_dir, rollout_batch, tis_cap, minibatches, epochs, monkeypatch):
    """The first minibatch's rows are not recomputed (epochs = minibatches = 1: no
    recompute at all), and the update is the same step, with the same metrics and the
    same per-token logprobs, as with the whole recompute (TIS clipping included). In the
    padded layout, where a row's forward is the same whatever rows it is batched with, so
    the two bookkeepings are compared bit for bit; the packed layout shares a prompt
    among the rows of the forward that holds them (test_learner_devices compares it with
    the padded update)."""
    samples, pad = rollout_batch
    skewed = [copy.copy(s) for s in samples]
    for i, s in enumerate(skewed):          # some tokens over the TIS cap, some under
        s.behaviour_logprobs = [lp + (0.3 if (i + j) % 2 else -0.3)
                                for j, lp in enumerate(s.behaviour_logprobs)]
    cfg = GrpoConfig(minibatches=minibatches, epochs=epochs, tis_cap=tis_cap, lr=1e-2)
    runs = {}
    n = len(skewed)
    for fused in (True, False):
        learner = Learner(load_policy(tiny_dir), cfg, 0.7, seed=0,
                          setup=LearnerConfig(packing=False))
        assert learner.fuses_recompute()
        calls = []
        recompute = learner.recompute
        monkeypatch.setattr(learner, "fuses_recompute", lambda f=fused: f)
        monkeypatch.setattr(learner, "recompute",
                            lambda b, c=calls, r=recompute: c.append(len(b)) or r(b))
        m = learner.update(pack(skewed, pad))
        rows = n - len(torch.arange(n).chunk(minibatches)[0])       # all but the first's
        assert calls == (([rows] if rows else []) if fused else [n])
        runs[fused] = (m, learner.last_logprobs,
                       {n: p.detach().clone() for n, p in learner.policy.named_parameters()})
    (m1, lp1, w1), (m0, lp0, w0) = runs[True], runs[False]
    assert m1.keys() == m0.keys()
    for k in m0:
        assert m1[k] == pytest.approx(m0[k], rel=1e-4, abs=1e-6), k
    mask = pack(skewed, pad).response_mask.bool()
    torch.testing.assert_close(lp1[mask], lp0[mask], rtol=0, atol=1e-5)
    for n in w0:
        torch.testing.assert_close(w1[n], w0[n], rtol=1e-4, atol=1e-6)


def test_a_policy_with_dropout_keeps_the_separate_recompute(tiny_dir):
    policy = load_policy(tiny_dir)
    policy.config.attention_dropout = 0.1
    assert not Learner(policy, GrpoConfig(minibatches=1), 1.0, seed=0).fuses_recompute()



@pytest.mark.slow
def test_a_compiled_learner_takes_the_eager_update_on_batches_of_any_shape(tiny_dir,
                                                                           rollout_batch):
    """learner.compile: inductor's fused layers give the eager step up to float rounding,
    on a second batch of another shape too, with the parameters named as before
    (checkpoints and weight sync see the same model)."""
    from torch._dynamo.utils import counters

    samples, pad = rollout_batch
    batches = [pack(samples, pad), pack(samples[:9], pad)]
    runs = {}
    torch._dynamo.reset()
    counters.clear()
    for compiled in (False, True):
        learner = Learner(load_policy(tiny_dir), GrpoConfig(minibatches=1, lr=1e-2), 1.0,
                          seed=0, setup=LearnerConfig(compile=compiled))
        metrics = [learner.update(b) for b in batches]
        runs[compiled] = metrics, dict(learner.policy.named_parameters())
    assert counters["stats"]["unique_graphs"] >= 1           # the layers did run compiled
    (m0, w0), (m1, w1) = runs[False], runs[True]
    assert w0.keys() == w1.keys()
    for a, b in zip(m0, m1, strict=True):
        for k in ("learner/loss", "learner/grad_norm", "learner/entropy"):
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), k
    # AdamW steps ~lr (1e-2) wherever a gradient is ~0, whatever its rounding: a few
    # elements may differ by a fraction of one step, none by a step, ~all not at all
    diffs = torch.cat([(w1[n] - w0[n]).detach().abs().flatten() for n in w0])
    assert float(diffs.max()) < 1e-3
    assert float((diffs > 1e-5).float().mean()) < 1e-3
