"""Every two-sided transport, for real: a local Ray cluster, two rollout-worker actors that
each serve a TorchRollout engine, and the learner's tensors pushed from this process.

The receiving engines fingerprint what they serve; the learner's fingerprint must equal
every one of them, versions must strictly increase, and a transfer whose bytes were
altered must show up as a mismatch. cuda_ipc and broadcast over NCCL need GPUs (not here).
"""

import pytest
import ray
import torch
from safetensors.torch import load_file

from engine.config import validate_config
from engine.rollout.torch_backend import TorchRollout
from engine.weightsync.base import StaleVersionError
from engine.weightsync.fingerprint import fingerprint
from engine.weightsync.session import EngineHost, TensorSource

from .sync_session import connect, push

pytestmark = pytest.mark.slow

TRANSPORTS = {
    "shm": {"type": "shm"},
    "object_store": {"type": "object_store"},
    "broadcast": {"type": "broadcast", "bucket_mb": 1},            # tiny model = ~4 buckets
    "broadcast_single_buffer": {"type": "broadcast", "bucket_mb": 1, "double_buffer": False},
    "checkpoint": {"type": "checkpoint"},
    "shm_delta": {"type": "shm", "delta": True},
    "object_store_delta": {"type": "object_store", "delta": True},
    "broadcast_delta": {"type": "broadcast", "bucket_mb": 1, "delta": True},
}


@ray.remote(num_cpus=0)
class RolloutWorker(EngineHost):
    def __init__(self, model_dir):
        super().__init__(TorchRollout.from_pretrained(model_dir))

    def served(self):
        return self.engine.weight_version(), self.engine.fingerprint()


@pytest.fixture(scope="module")
def workers(tiny_dir, ray_gpus):
    actors = [RolloutWorker.remote(str(tiny_dir)) for _ in range(2)]
    yield actors
    for actor in actors:
        ray.kill(actor)


@pytest.fixture
def learner(tiny_dir):
    return dict(load_file(tiny_dir / "model.safetensors"))


def _perturb(tensors, seed):
    gen = torch.Generator().manual_seed(seed)
    for t in tensors.values():
        t.add_(torch.randn(t.shape, generator=gen) * 1e-3)


def _connect(workers, kind, source=None):
    return connect(validate_config({"weight_sync": TRANSPORTS[kind]}).weight_sync, workers,
                   source)


def _push(sync, learner, version, **kw):
    return push(*sync, list(learner.items()), version, **kw)


class Misreporting(TensorSource):
    """A learner that reports ``truth`` as the fingerprint of whatever it sends."""

    def __init__(self, truth):
        super().__init__([])
        self.truth = truth

    def weights_fingerprint(self, named):
        return self.truth


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_receivers_serve_the_learners_fingerprint_with_increasing_versions(
        workers, learner, kind):
    sync = _connect(workers, kind)
    first = ray.get(workers[0].served.remote())[0]
    res = _push(sync, learner, first, initial=True)    # may repeat the served one
    assert res.matched
    seen = {res.fingerprint_learner}
    for version in range(first + 1, first + 4):
        _perturb(learner, version)
        res = _push(sync, learner, version)
        fp = fingerprint(learner.items())
        assert res.matched and res.fingerprint_learner == fp
        assert [(r.version, r.fingerprint) for r in res.workers] == [(version, fp)] * 2
        assert ray.get([w.served.remote() for w in workers]) == [(version, fp)] * 2
        assert res.bytes == sum(t.numel() * 4 for t in learner.values())
        assert res.latency_s > 0 and res.gb_per_s > 0
        if TRANSPORTS[kind].get("delta"):         # an XOR against the version before
            assert res.delta.base == version - 1 and 0 < res.wire_bytes < res.bytes
        seen.add(fp)
    assert len(seen) == 4                       # every sync really changed the weights
    sync[1].close_sender()


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_a_stale_or_repeated_version_is_refused_and_the_next_one_still_lands(
        workers, learner, kind):
    sync = _connect(workers, kind)
    v = ray.get(workers[0].served.remote())[0] + 1
    assert _push(sync, learner, v).matched
    for stale in (v, v - 1):
        with pytest.raises(StaleVersionError, match="must strictly increase"):
            _push(sync, learner, stale)
    _perturb(learner, 99)
    res = _push(sync, learner, v + 1)
    assert res.matched and res.version_rollout == v + 1
    sync[1].close_sender()


@pytest.mark.parametrize("kind", TRANSPORTS)
def test_bytes_altered_on_the_way_are_reported_as_a_mismatch(workers, learner, kind):
    truth = fingerprint(learner.items())
    sync = _connect(workers, kind, Misreporting(truth))
    v = ray.get(workers[0].served.remote())[0] + 1
    altered = {k: t.clone() for k, t in learner.items()}
    altered["model.layers.1.mlp.down_proj.weight"][5, 9] += 1e-2
    res = _push(sync, altered, v)
    assert not res.matched and res.fingerprint_learner == truth
    assert res.version_rollout == v             # the version alone would say all is well
    assert {r.fingerprint for r in res.workers} == {fingerprint(altered.items())}
    sync[1].close_sender()


def test_shm_workers_read_the_shared_buffer_itself(workers, learner):
    """A byte flipped in the shared file after the learner packed it reaches the engines:
    they load from the mapping, not from a copy made when the ticket was written."""
    _, source = _connect(workers, "shm")
    v = ray.get(workers[0].served.remote())[0] + 1
    ticket = source.sender.prepare(list(learner.items()), v)
    spec = ticket.layout.specs[3]
    flat = torch.from_file(ticket.payload, shared=True, size=ticket.layout.nbytes,
                           dtype=torch.uint8)
    flat[spec.offset] ^= 0x01
    served = ray.get([w.receive_weights.remote(ticket, 0) for w in workers])
    assert {s.report.fingerprint for s in served} != {fingerprint(learner.items())}
    source.close_sender()


def test_shm_syncs_adopted_learner_parameters_without_a_learner_side_copy(workers, tiny_dir):
    """After adopt, the policy's parameters are the shared buffer's slots: an optimizer
    step writes into shared memory and the workers serve exactly the stepped weights."""
    from engine.model import load_policy

    policy = load_policy(tiny_dir)
    sync = _connect(workers, "shm")
    sender = sync[1].sender
    sender.adopt(policy.named_parameters())
    slots = dict(sender.layout.views(sender._flat))
    assert all(p.data_ptr() == slots[n].data_ptr() for n, p in policy.named_parameters())
    v = ray.get(workers[0].served.remote())[0]
    opt = torch.optim.SGD(policy.parameters(), lr=1e-2)
    for step in range(1, 3):
        for p in policy.parameters():
            p.grad = torch.randn_like(p)
        opt.step()
        named = [(n, p.detach()) for n, p in policy.named_parameters()]
        res = push(*sync, named, v + step)
        assert res.matched and res.fingerprint_learner == fingerprint(named)
    sender.close()
