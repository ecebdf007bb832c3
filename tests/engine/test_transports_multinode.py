"""Transports that cross nodes, on a two-node ray.cluster_utils.Cluster: the learner on
the head, the rollout worker pinned to the other node (its own raylet and object store, so
the object store really copies between nodes and the broadcast joins by the head's
address)."""


import pytest
import ray
import torch
from ray.cluster_utils import Cluster
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from safetensors.torch import load_file

from engine.config import validate_config
from engine.rollout.torch_backend import TorchRollout
from engine.weightsync.fingerprint import fingerprint
from engine.weightsync.session import EngineHost

from .. import shared
from .sync_session import connect, push

pytestmark = pytest.mark.slow


@ray.remote(num_cpus=1)
class RolloutWorker(EngineHost):
    def __init__(self, model_dir):
        super().__init__(TorchRollout.from_pretrained(model_dir))

    def node(self):
        return ray.get_runtime_context().get_node_id()


@pytest.fixture(scope="module")
def remote_worker(tiny_dir):
    shared.LOCAL_RAY.stop()      # one Ray per process: this one joins a cluster of its own
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    other = cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        worker = RolloutWorker.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
            other.node_id, soft=False)).remote(str(tiny_dir))
        assert ray.get(worker.node.remote()) != ray.get_runtime_context().get_node_id()
        yield worker
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.mark.parametrize("kind", ["object_store", "broadcast", "checkpoint"])
def test_weights_reach_a_worker_on_another_node(remote_worker, tiny_dir, kind):
    cfg = validate_config({"weight_sync": {"type": kind}}).weight_sync
    sync = connect(cfg, [remote_worker])
    learner = dict(load_file(tiny_dir / "model.safetensors"))
    base = {"object_store": 10, "broadcast": 20, "checkpoint": 30}[kind]
    for version in (base, base + 1):
        with torch.no_grad():
            for t in learner.values():
                t.add_(torch.randn_like(t) * 1e-3)
        res = push(*sync, list(learner.items()), version, initial=version == base)
        assert res.matched and res.version_rollout == version
        assert res.fingerprint_learner == fingerprint(learner.items())
    sync[1].close_sender()
