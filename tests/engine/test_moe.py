"""Mixture-of-Experts path models and routing replay (engine.moe): the torch sampler
records each token's experts, the learner replays them, and moe/routing_agreement shows
how often the learner's own router would have chosen the same. Tiny random Qwen2-MoE
(top-2 weights not renormalized) and Mixtral (renormalized) models, built locally
(tests/engine/hf_models.py)."""

import numpy as np
import pytest
import torch
from transformers import MixtralConfig, Qwen2MoeConfig
from transformers.models.mixtral.modeling_mixtral import MixtralTopKRouter
from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeTopKRouter

from engine.api import run_local
from engine.config import ConfigError, GrpoConfig, LearnerConfig, validate_config
from engine.experience import Sample
from engine.learner.batch import pack
from engine.learner.learner import Learner
from engine.model import load_policy, load_tokenizer
from engine.moe import RouterHooks, moe_routers
from engine.orchestration.partial import Row
from engine.rollout.base import Completion, SamplingParams
from engine.rollout.torch_backend import TorchRollout
from engine.tasks.base import Problem

from .conftest import small_run
from .hf_models import MOE_ARCHITECTURES, build_hf_model
from .test_hf_models import TEXTS

DENSE_BOUND = 1e-4     # sampler vs learner logprobs in fp32 (tests/engine/test_hf_models.py)
TIE = 1e-5             # router rows differ by this much: every routing decision is near-tied


@pytest.fixture(scope="module")
def moe_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe")
    return {arch: build_hf_model(root / arch, arch) for arch in MOE_ARCHITECTURES}


@pytest.fixture(scope="module")
def near_tied_dirs(tmp_path_factory):
    """The MoE models with every router's rows made equal up to TIE: each token's top-2
    is decided by differences of ~TIE, which a perturbation of that size flips."""
    root = tmp_path_factory.mktemp("tied")
    dirs = {}
    for arch in MOE_ARCHITECTURES:
        path = build_hf_model(root / arch, arch)
        policy = load_policy(path)
        perturb_routers(policy, TIE, seed=0, around_first_row=True)
        policy.save_pretrained(path)
        dirs[arch] = path
    return dirs


def perturb_routers(model: torch.nn.Module, scale: float, seed: int,
                    around_first_row: bool = False) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for router in moe_routers(model):
            base = router.weight[:1].clone() if around_first_row else router.weight.clone()
            router.weight.copy_(base + scale * torch.randn(router.weight.shape, generator=g))


def rollout_samples(path, record: bool = True) -> list[Sample]:
    tok = load_tokenizer(path)
    prompts = [tok(t)["input_ids"] for t in TEXTS] * 2
    engine = TorchRollout.from_pretrained(path, record_routing=record)
    outs = engine.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=12), seed=3)
    return [Sample(Problem("", ""), p, o.token_ids, o.logprobs, o.finished, o.version, 0,
                   routing=o.routing) for p, o in zip(prompts, outs, strict=True)]


def learner_metrics(path, samples: list[Sample], replay: bool, perturb: float = 0.0,
                    packing: bool = True) -> dict[str, float]:
    """The learner's first update on the rollout's samples: logprob gap and agreement
    are measured before its optimizer step. ``perturb``: the learner's routers differ
    from the sampler's by noise of this size."""
    policy = load_policy(path)
    if perturb:
        perturb_routers(policy, perturb, seed=1)
    learner = Learner(policy, GrpoConfig(), 1.0, seed=0,
                      setup=LearnerConfig(routing_replay=replay, packing=packing))
    return learner.update(pack(samples, load_tokenizer(path).pad_token_id))


# --------------------------------------------------------------------------- recording

@pytest.mark.parametrize("arch", MOE_ARCHITECTURES)
def test_the_sampler_records_the_experts_of_every_token_it_fed(moe_dirs, arch):
    path = moe_dirs[arch]
    samples = rollout_samples(path)
    policy = load_policy(path).eval()
    routers = moe_routers(policy)
    assert len(routers) == 2 and routers[0].top_k == 2
    for s in samples:
        assert s.routing.shape == (len(s.prompt_ids) + len(s.response_ids) - 1, 2, 2)
    # A teacher-forced forward of each whole sequence routes every fed token the same.
    hooks = RouterHooks(policy)
    for s in samples[:4]:
        with torch.no_grad():
            policy(input_ids=torch.tensor([s.prompt_ids + s.response_ids]))
        own = hooks.chosen()[:-1].sort(-1).values                     # (tokens fed, L, k)
        assert torch.equal(own, torch.from_numpy(s.routing).long().sort(-1).values)


def test_a_dense_model_has_no_router_to_record(tmp_path):
    path = build_hf_model(tmp_path / "qwen2", "qwen2")
    with pytest.raises(ValueError, match="no Mixture-of-Experts router"):
        TorchRollout.from_pretrained(path, record_routing=True)
    assert TorchRollout.from_pretrained(path).router is None


# --------------------------------------------------------------------------- replay

@pytest.mark.parametrize("arch", MOE_ARCHITECTURES)
def test_with_routing_replay_the_learner_equals_the_rollout_and_agrees_fully(moe_dirs, arch):
    samples = rollout_samples(moe_dirs[arch])
    for packing in (True, False):
        m = learner_metrics(moe_dirs[arch], samples, replay=True, packing=packing)
        assert m["logprob_gap/max"] < DENSE_BOUND
        assert m["moe/routing_agreement"] == 1.0


@pytest.mark.parametrize("arch", MOE_ARCHITECTURES)
def test_near_tied_routers_flipped_by_a_perturbation_open_a_gap_that_replay_closes(
        near_tied_dirs, arch):
    path = near_tied_dirs[arch]
    samples = rollout_samples(path)
    free = learner_metrics(path, samples, replay=False, perturb=TIE)
    replayed = learner_metrics(path, samples, replay=True, perturb=TIE)
    # The learner's own routers disagree with the rollout's on many tokens (replay or
    # not: agreement is what the learner's router would choose itself)...
    assert free["moe/routing_agreement"] < 0.8 and replayed["moe/routing_agreement"] < 0.8
    # ...which without replay shows as a logprob gap far over the dense bound, and with
    # replay the perturbation is left only in the routing weights: back within it.
    assert free["logprob_gap/max"] > 100 * DENSE_BOUND
    assert replayed["logprob_gap/max"] < DENSE_BOUND
    assert free["logprob_gap/mean"] > 100 * replayed["logprob_gap/mean"]


def test_a_batch_without_recorded_routing_reports_no_agreement(moe_dirs):
    path = moe_dirs["qwen2_moe"]
    m = learner_metrics(path, rollout_samples(path, record=False), replay=False)
    assert "moe/routing_agreement" not in m and m["logprob_gap/max"] < DENSE_BOUND


def routers_of_each_kind() -> list[tuple[torch.nn.Module, bool]]:
    """(a router, whether its top-k weights are renormalized)."""
    common = dict(hidden_size=8, num_experts_per_tok=2)
    return [(Qwen2MoeTopKRouter(Qwen2MoeConfig(num_experts=4, norm_topk_prob=False,
                                               **common)), False),
            (Qwen2MoeTopKRouter(Qwen2MoeConfig(num_experts=4, norm_topk_prob=True,
                                               **common)), True),
            (MixtralTopKRouter(MixtralConfig(num_local_experts=4, **common)), True)]


@pytest.mark.parametrize("router,normalized", routers_of_each_kind())
def test_replayed_weights_are_the_routers_softmax_at_the_recorded_experts(router, normalized):
    torch.manual_seed(0)
    with torch.no_grad():
        router.weight.normal_()
    h = torch.randn(5, 8)
    own_logits, own_weights, own_experts = router(h)
    hooks = RouterHooks(router, replay=True)
    recorded = torch.tensor([[3, 0], [1, 2], [0, 1], [2, 3], [-1, -1]])      # (N, k)
    hooks.route(recorded[:, None, :])                                         # (N, L=1, k)
    logits, weights, experts = router(h)
    probs = torch.softmax(own_logits, -1)
    want = probs.gather(-1, recorded[:4])
    if normalized:
        want = want / want.sum(-1, keepdim=True)
    assert torch.equal(experts[:4], recorded[:4]) and torch.allclose(weights[:4], want)
    # an unrecorded token keeps the router's own choice and weights
    assert torch.equal(experts[4], own_experts[4])
    assert torch.allclose(weights[4], own_weights[4])
    assert torch.equal(hooks.chosen()[:, 0], own_experts)    # what it would have chosen
    # the router still learns: gradients reach it through the replayed weights
    weights[:, 0].sum().backward()
    assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0
    hooks.route(None)
    assert torch.equal(router(h)[2], own_experts)


def test_a_continued_partial_row_keeps_each_positions_first_routing():
    def completion(n_in: int, tokens: list[int], fill: int, aborted: bool) -> Completion:
        routing = np.full((n_in + len(tokens) - 1, 1, 2), fill, dtype=np.int16)
        return Completion(tokens, [0.0] * len(tokens), False, fill, aborted, routing)

    prompt = 3
    row = Row().extend(completion(prompt, [7, 8], fill=1, aborted=True), budget=6)
    assert row.routing.shape[0] == prompt + 1
    # the continuation re-feeds prompt + 2 tokens, samples 5 of which 4 fit the budget
    row = row.extend(completion(prompt + 2, [1, 2, 3, 4, 5], fill=2, aborted=False), budget=6)
    assert row.token_ids == [7, 8, 1, 2, 3, 4]
    assert row.routing[:, 0, 0].tolist() == [1, 1, 1, 1, 2, 2, 2, 2]   # prompt + 6 - 1


# --------------------------------------------------------------------------- config

def test_routing_replay_is_refused_where_it_cannot_work(moe_dirs, tmp_path):
    moe = {"path": str(moe_dirs["mixtral"])}
    dense = {"path": str(build_hf_model(tmp_path / "llama", "llama"))}
    record = {"record_routing": True}

    def error(**sections) -> tuple[str, str]:
        with pytest.raises(ConfigError) as exc:
            validate_config(sections)
        [(field, msg)] = exc.value.errors
        return field, msg

    field, msg = error(model=moe, learner={"routing_replay": True})
    assert field == "learner.routing_replay" and "rollout.record_routing = true" in msg
    field, msg = error(model=moe, rollout={"type": "vllm", **record})
    assert field == "rollout.record_routing" and 'rollout.type = "torch"' in msg
    field, msg = error(model=dense, rollout=record)
    assert field == "rollout.record_routing" and "dense model" in msg
    field, msg = error(rollout=record, learner={"routing_replay": True})
    assert field == "rollout.record_routing" and "model.size" in msg
    cfg = validate_config({"model": moe, "rollout": record, "learner": {"routing_replay": True}})
    assert cfg.rollout.record_routing and cfg.learner.routing_replay


# --------------------------------------------------------------------------- a run

@pytest.mark.slow
def test_a_grpo_run_on_a_tiny_moe_model_replays_routing_and_syncs(moe_dirs, tmp_path):
    cfg = small_run(model={"path": str(moe_dirs["qwen2_moe"])},
                    rollout={"temperature": 1.0, "max_new_tokens": 6, "record_routing": True},
                    learner={"routing_replay": True})
    summary = run_local(cfg, tmp_path)
    assert summary.status == "succeeded" and summary.steps_done == 2
    m = summary.last_metrics
    assert m["weight_sync/matched"] == 1.0
    assert m["moe/routing_agreement"] == 1.0 and m["logprob_gap/max"] < DENSE_BOUND


def sharded_rank(rank: int, world: int, port: int, path, batch, out_path) -> None:
    from .test_learner_sharded import gloo_group

    with gloo_group(rank, world, port):
        from engine.learner.sharded import ShardedLearner

        policy = load_policy(path)
        perturb_routers(policy, TIE, seed=1)
        learner = ShardedLearner(policy, GrpoConfig(), 1.0, seed=0,
                                 setup=LearnerConfig(routing_replay=True))
        metrics = learner.update(batch)
        if rank == 0:
            torch.save(metrics, out_path)


@pytest.mark.slow
def test_an_fsdp_sharded_learner_replays_routing_too(near_tied_dirs, tmp_path):
    from .test_learner_sharded import run_ranks

    path = near_tied_dirs["qwen2_moe"]
    batch = pack(rollout_samples(path), load_tokenizer(path).pad_token_id)
    run_ranks(sharded_rank, 2, path, batch, tmp_path / "m.pt")
    m = torch.load(tmp_path / "m.pt")
    assert m["moe/routing_agreement"] < 0.8 and m["logprob_gap/max"] < DENSE_BOUND


@pytest.mark.slow
def test_routing_travels_from_ray_rollout_workers_to_the_learner(ray_gpus, moe_dirs, tmp_path):
    from engine.api import MetricsEvent, WeightSyncEvent
    from engine.telemetry.sinks import MemorySink

    cfg = small_run(steps=3, model={"path": str(moe_dirs["mixtral"])},
                    placement={"type": "disaggregated"}, async_policy={"type": "one_step_off"},
                    weight_sync={"type": "object_store"},
                    rollout={"max_new_tokens": 6, "record_routing": True},
                    learner={"routing_replay": True})
    sink = MemorySink()
    summary = run_local(cfg, tmp_path, sink=sink)
    assert (summary.status, summary.steps_done) == ("succeeded", 3)
    steps = [e.values for e in sink.events
             if isinstance(e, MetricsEvent) and "staleness/max" in e.values]
    assert len(steps) == 3 and all(0.0 < m["moe/routing_agreement"] <= 1.0 for m in steps)
    assert all(s.matched for s in sink.events if isinstance(s, WeightSyncEvent))
