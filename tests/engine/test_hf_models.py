"""model.path checkpoints of several architectures through the torch rollout backend and
the learner: tiny random-weight Llama, Qwen2 (q/k/v biases, tied embeddings, no pad
token), Qwen3 (q/k norms) and Mistral (tied), each with a locally trained BPE tokenizer
and a chat template (tests/engine/hf_models.py); the sampler/learner logprob and weight
sync oracles also run the Mixture-of-Experts Qwen2-MoE and Mixtral (routing replay:
tests/engine/test_moe.py)."""

import pytest
import torch

from engine.api import run_local
from engine.config import GrpoConfig
from engine.learner.learner import Learner
from engine.model import load_policy, load_tokenizer, stop_token_ids
from engine.rollout.base import SamplingParams
from engine.rollout.hf_kv import HFKV
from engine.rollout.llama_kv import LlamaKV
from engine.rollout.torch_backend import TorchRollout
from engine.weightsync.fingerprint import fingerprint

from .conftest import small_run
from .hf_models import ARCHITECTURES, IM_END, MOE_ARCHITECTURES, build_hf_model
from .sync_session import sync_in_place
from .test_torch_sampler import check_turns
from .test_vllm_backend import perturbed, recompute

TEXTS = ["12+34=", "Natalia sold clips to 48 of her friends.", "rev:abcdef=", "7*8=",
         "How many clips did she sell? Let us think step by step."]


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {arch: build_hf_model(root / arch, arch)
            for arch in ARCHITECTURES + MOE_ARCHITECTURES}


def prompts_for(tok) -> list[list[int]]:
    """Raw prompts and chat-rendered ones, of different lengths (left padding matters)."""
    chats = [tok.apply_chat_template([{"role": "user", "content": t}],
                                     add_generation_prompt=True, tokenize=False)
             for t in TEXTS[:2]]
    return [tok(t)["input_ids"] for t in TEXTS + chats]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("arch", ARCHITECTURES + MOE_ARCHITECTURES)
def test_sampler_logprobs_equal_the_learners_recompute(hf_dirs, arch, temperature):
    path = hf_dirs[arch]
    tok, policy = load_tokenizer(path), load_policy(path).eval()
    engine = TorchRollout.from_pretrained(path)
    prompts = prompts_for(tok) * 3
    outs = engine.generate(prompts, SamplingParams(temperature=temperature, max_new_tokens=12),
                           seed=3)
    learner, behaviour, mask = recompute(policy, prompts, outs, temperature, tok.pad_token_id)
    assert mask.sum() > 60
    assert (learner - behaviour).abs()[mask].max() < 1e-4
    if temperature != 1.0:     # and the check can fail: an untempered recompute disagrees
        raw, _, _ = recompute(policy, prompts, outs, 1.0, tok.pad_token_id)
        assert (raw - behaviour).abs()[mask].max() > 1e-2


def test_the_self_built_llama_path_serves_llama_and_every_other_arch_its_own_forward(hf_dirs):
    kinds = {a: type(TorchRollout.from_pretrained(hf_dirs[a]).model) for a in ARCHITECTURES}
    assert kinds == {"llama": LlamaKV, "qwen2": HFKV, "qwen3": HFKV, "mistral": HFKV}


def test_a_tied_llama_takes_the_fast_path_with_the_embedding_as_its_head(tmp_path):
    path = build_hf_model(tmp_path / "tied", "llama", tie_word_embeddings=True)
    tok = load_tokenizer(path)
    engine = TorchRollout.from_pretrained(path)
    assert isinstance(engine.model, LlamaKV) and "lm_head.weight" not in engine.tensors
    learner = Learner(load_policy(path), GrpoConfig(), 1.0, seed=0)
    new = perturbed(learner.policy)
    assert sync_in_place(engine, learner.named_tensors(), 1).matched
    prompts = prompts_for(tok)
    outs = engine.generate(prompts, SamplingParams(temperature=0.7, max_new_tokens=10), 2)
    lp, behaviour, mask = recompute(new.eval(), prompts, outs, 0.7, tok.pad_token_id)
    assert (lp - behaviour).abs()[mask].max() < 1e-4


def test_llama3_rope_scaling_is_left_to_the_models_own_forward():
    from transformers import LlamaConfig

    plain = LlamaConfig(hidden_size=64, num_attention_heads=2)
    scaled = LlamaConfig(hidden_size=64, num_attention_heads=2, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192})
    biased = LlamaConfig(hidden_size=64, num_attention_heads=2, attention_bias=True)
    assert LlamaKV.supports(plain)
    assert not LlamaKV.supports(scaled) and not LlamaKV.supports(biased)


def test_both_forwards_sample_the_same_tokens_on_a_llama(hf_dirs):
    path = hf_dirs["llama"]
    prompts = prompts_for(load_tokenizer(path))
    params = SamplingParams(temperature=1.0, max_new_tokens=10)
    fast = TorchRollout.from_pretrained(path).generate(prompts, params, seed=4)
    generic = TorchRollout.from_pretrained(path, forward="hf").generate(prompts, params, seed=4)
    assert [o.token_ids for o in fast] == [o.token_ids for o in generic]
    for a, b in zip(fast, generic, strict=True):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4


@pytest.mark.parametrize("arch", ARCHITECTURES + MOE_ARCHITECTURES)
def test_a_weight_sync_is_served_with_a_matching_fingerprint(hf_dirs, arch):
    path = hf_dirs[arch]
    tok = load_tokenizer(path)
    learner = Learner(load_policy(path), GrpoConfig(), 1.0, seed=0)
    engine = TorchRollout.from_pretrained(path)
    assert engine.fingerprint() == learner.fingerprint()        # same names, same bytes
    old = load_policy(path).eval()
    new = perturbed(learner.policy)
    res = sync_in_place(engine, learner.named_tensors(), 5)
    assert res.matched and res.version_rollout == 5
    assert res.fingerprint_rollout == fingerprint(new.named_parameters())
    prompts = prompts_for(tok) * 2
    outs = engine.generate(prompts, SamplingParams(max_new_tokens=8), seed=0)
    new_lp, behaviour, mask = recompute(new.eval(), prompts, outs, 1.0, tok.pad_token_id)
    old_lp, _, _ = recompute(old, prompts, outs, 1.0, tok.pad_token_id)
    assert (new_lp - behaviour).abs()[mask].max() < 1e-4       # serves the new weights
    assert (old_lp - behaviour).abs()[mask].max() > 1e-2       # and not the old ones
    assert all(o.version == 5 for o in outs)


@pytest.mark.parametrize("arch", ["qwen2", "mistral"])
def test_tied_embeddings_are_one_tensor_on_both_sides(hf_dirs, arch):
    policy = load_policy(hf_dirs[arch])
    names = [n for n, _ in policy.named_parameters()]
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names
    assert policy.lm_head.weight is policy.model.embed_tokens.weight
    engine = TorchRollout.from_pretrained(hf_dirs[arch])
    assert sorted(engine.tensors) == sorted(names)


def test_a_sync_that_does_not_apply_is_caught_on_a_biased_tensor(hf_dirs):
    path = hf_dirs["qwen2"]
    learner = Learner(load_policy(path), GrpoConfig(), 1.0, seed=0)
    engine = TorchRollout.from_pretrained(path)
    with torch.no_grad():
        learner.policy.model.layers[1].self_attn.k_proj.bias[0] += 1e-3
    named = [(n, t) for n, t in learner.named_tensors() if not n.endswith("k_proj.bias")]
    res = sync_in_place(engine, named, 1)
    assert not res.matched


def test_the_tokenizer_pads_left_and_falls_back_to_eos_for_padding(hf_dirs):
    qwen2 = load_tokenizer(hf_dirs["qwen2"])                   # saved without a pad token
    assert qwen2.pad_token_id == qwen2.eos_token_id
    llama = load_tokenizer(hf_dirs["llama"])
    assert llama.pad_token == "<pad>" and llama.pad_token_id != llama.eos_token_id
    batch = llama(["1+1=", "Natalia sold clips"], padding=True)["attention_mask"]
    assert batch[0][0] == 0 and batch[0][-1] == 1              # left padding


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_stop_ids_are_eos_and_the_chat_templates_end_of_turn(hf_dirs, arch):
    tok = load_tokenizer(hf_dirs[arch])
    assert stop_token_ids(tok, hf_dirs[arch]) == tuple(sorted(
        {tok.eos_token_id, tok.convert_tokens_to_ids(IM_END)}))


def test_stop_ids_of_a_tokenizer_without_a_chat_template_are_its_eos(tiny_dir):
    tok = load_tokenizer(tiny_dir)
    assert stop_token_ids(tok, tiny_dir) == (tok.eos_token_id,)


@pytest.mark.parametrize("arch", ["qwen3", "qwen2"])
def test_generation_stops_at_any_stop_id_and_counts_it_finished(hf_dirs, arch):
    path = hf_dirs[arch]
    engine, tok = TorchRollout.from_pretrained(path), load_tokenizer(path)
    stops = tuple(range(100, 116))      # frequent enough under a random model's ~uniform
    prompts = prompts_for(tok) * 10
    outs = engine.generate(prompts, SamplingParams(temperature=1.5, max_new_tokens=16,
                                                   stop_token_ids=stops), seed=5)
    ends = set(stops) | set(engine.eos_ids)
    assert any(o.finished and o.token_ids[-1] in stops for o in outs)
    assert any(not o.finished for o in outs)
    for o in outs:
        assert not ends & set(o.token_ids[:-1])
        assert o.finished == (o.token_ids[-1] in ends)
        assert o.finished or len(o.token_ids) == 16
    plain = engine.generate(prompts, SamplingParams(temperature=1.5, max_new_tokens=16), seed=5)
    assert sum(len(o.token_ids) for o in plain) > sum(len(o.token_ids) for o in outs)


def test_on_complete_streams_and_stops_on_the_generic_forward(hf_dirs):
    from .test_torch_sampler import check_stop, check_streaming

    path = hf_dirs["qwen2"]
    engine, tok = TorchRollout.from_pretrained(path), load_tokenizer(path)
    prompts = prompts_for(tok) * 6
    params = SamplingParams(temperature=1.5, max_new_tokens=16,
                            stop_token_ids=tuple(range(100, 130)))
    lengths = check_streaming(engine, prompts, params, seed=5)
    assert lengths == sorted(lengths) and lengths[9] < 16
    check_stop(engine, prompts, params, seed=5, keep=10)


def test_a_grpo_run_on_a_path_model_completes(hf_dirs, tmp_path):
    cfg = small_run(model={"path": str(hf_dirs["qwen2"])},
                    rollout={"temperature": 0.7, "max_new_tokens": 6})
    assert cfg.warm_start_steps == 0           # a checkpoint starts RL from its own weights
    summary = run_local(cfg, tmp_path)
    assert summary.status == "succeeded" and summary.steps_done == 2
    assert summary.last_metrics["weight_sync/matched"] == 1.0
    assert "eval/reward_mean" in summary.eval_after
    assert "rollout/prefix_hit_frac" not in summary.last_metrics    # no turn is continued


@pytest.mark.slow
def test_a_configured_warm_start_trains_a_path_model_before_rl(hf_dirs, tmp_path):
    # A short SFT gives the random model some well-formed answers, so groups have reward
    # variance and the policy (and its KL to the warm-started reference) really moves.
    cfg = small_run(model={"path": str(hf_dirs["mistral"])},
                    warm_start={"steps": 40, "batch_size": 32, "lr": 3e-3},
                    rollout={"temperature": 1.0, "max_new_tokens": 6, "prompts_per_step": 8},
                    algorithm={"group_size": 4, "minibatches": 1, "lr": 1e-3, "kl_coef": 0.1})
    summary = run_local(cfg, tmp_path)
    assert summary.status == "succeeded"
    m = summary.last_metrics
    assert m["weight_sync/matched"] == 1.0
    assert m["learner/grad_norm"] > 0.0 and m["learner/kl_ref"] > 0.0


def test_the_unscaled_logprobs_fault_works_on_the_generic_forward(hf_dirs):
    from engine.faults import untempered_logprobs

    path = hf_dirs["qwen3"]
    tok, policy = load_tokenizer(path), load_policy(path).eval()
    engine = TorchRollout.from_pretrained(path)
    prompts = prompts_for(tok)
    outs = engine.generate(prompts, SamplingParams(temperature=0.7, max_new_tokens=8), 1)
    for o, lps in zip(outs, untempered_logprobs(engine, prompts, outs), strict=True):
        o.logprobs = lps
    raw, behaviour, mask = recompute(policy, prompts, outs, 1.0, tok.pad_token_id)
    assert (raw - behaviour).abs()[mask].max() < 1e-4


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_a_continued_context_on_the_generic_forward_samples_what_a_full_prefill_does(
        hf_dirs, arch, monkeypatch):
    """The prefix cache on transformers' own cache: three turns of groups of 3
    (check_turns), then three with a context the cache has not seen in each batch."""
    tok = load_tokenizer(hf_dirs[arch])
    cached = TorchRollout.from_pretrained(hf_dirs[arch])
    assert isinstance(cached.model, HFKV) and cached.prefixes is not None
    plain = TorchRollout.from_pretrained(hf_dirs[arch], prefix_cache_mb=0)
    for miss in (False, True):
        check_turns(cached, plain, tok, [p for p in prompts_for(tok) for _ in range(3)],
                    monkeypatch, observation="ok", miss=miss)


def test_a_sliding_window_cache_keeps_no_prefixes(hf_dirs, tmp_path):
    """A Mistral whose layers keep a sliding window: a stored prefix cannot be put into
    such a cache (the torch sampler prefills that model's contexts whole)."""
    windowed = build_hf_model(tmp_path / "windowed", "mistral", sliding_window=16)
    assert TorchRollout.from_pretrained(windowed).prefixes is None
    assert TorchRollout.from_pretrained(hf_dirs["mistral"]).prefixes is not None
