"""Transport pieces without Ray: the flat layout and its buckets, the version rule, the
broadcast's bucketed double-buffered transfer over a real gloo group (two threads), and
the clear refusals."""

import threading

import pytest
import torch

from engine.config import ConfigError, validate_config
from engine.rollout.base import WeightReport
from engine.weightsync import build_receiver, build_sender
from engine.weightsync.base import (
    StaleVersionError,
    SyncResult,
    Ticket,
    TransportUnavailable,
    check_version,
)
from engine.weightsync.fingerprint import fingerprint
from engine.weightsync.layout import ALIGN, FlatLayout


def _mixed():
    g = torch.Generator().manual_seed(0)
    return [
        ("odd", torch.randn(7, generator=g)),                          # 28 bytes
        ("scalar", torch.tensor(3.5, dtype=torch.float64)),
        ("bytes", torch.randint(0, 255, (3,), dtype=torch.uint8, generator=g)),
        ("bf16", torch.randn(5, 3, generator=g).to(torch.bfloat16)),
        ("big", torch.randn(41, 13, generator=g)),                     # 2132 bytes
        ("ints", torch.arange(11, dtype=torch.int64)),
        ("strided", torch.randn(6, 4, generator=g).t()),               # not contiguous
    ]


def _same(named_a, named_b):
    assert [n for n, _ in named_a] == [n for n, _ in named_b]
    for (_, a), (_, b) in zip(named_a, named_b, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def test_a_layout_aligns_every_tensor_and_round_trips_mixed_dtypes():
    named = _mixed()
    layout = FlatLayout.of(named)
    assert all(s.offset % ALIGN == 0 for s in layout.specs)
    assert layout.payload_bytes == sum(t.numel() * t.element_size() for _, t in named)
    flat = torch.empty(layout.nbytes, dtype=torch.uint8)
    layout.pack([t for _, t in named], flat)
    _same(layout.views(flat), named)


@pytest.mark.parametrize("bucket", [1, 100, 333, 2048, 10**6])
def test_buckets_packed_one_by_one_rebuild_the_stream(bucket):
    """Odd bucket sizes cut tensors anywhere; "big" spans several 100-byte buckets."""
    named = _mixed()
    layout = FlatLayout.of(named)
    buckets = layout.buckets(bucket)
    assert buckets[0][0] == 0 and buckets[-1][1] == layout.nbytes
    assert all(b - a <= bucket for a, b in buckets)
    assert all(b0 == a1 for (_, b0), (a1, _) in zip(buckets, buckets[1:], strict=False))
    flat = torch.empty(layout.nbytes, dtype=torch.uint8)
    staging = torch.empty(bucket, dtype=torch.uint8)
    for a, b in buckets:
        layout.pack([t for _, t in named], staging[:b - a], start=a)
        flat[a:b] = staging[:b - a]
    _same(layout.views(flat), named)


def test_views_share_memory_with_the_stream():
    named = [("w", torch.zeros(4))]
    layout = FlatLayout.of(named)
    flat = torch.zeros(layout.nbytes, dtype=torch.uint8)
    (_, view), = layout.views(flat)
    flat[:4] = torch.tensor([1.0]).view(torch.uint8)
    assert view[0] == 1.0


def _ticket(version, initial=False):
    return Ticket("shm", version, initial, FlatLayout.of([]))


def test_a_receiver_refuses_versions_that_do_not_strictly_increase():
    check_version(_ticket(5), served=4)
    check_version(_ticket(4, initial=True), served=4)       # a run's first sync
    for stale in (4, 3):
        with pytest.raises(StaleVersionError, match="strictly increase"):
            check_version(_ticket(stale), served=4)


def test_one_worker_serving_other_weights_makes_the_sync_a_mismatch():
    good, bad = WeightReport(3, "aa", 8), WeightReport(3, "bb", 8)
    res = SyncResult("shm", 0, 3, 3, "aa", "aa", 8, 0.5, workers=(good, good))
    assert res.matched and res.gb_per_s == pytest.approx(8 / 1e9 / 0.5)
    assert not SyncResult("shm", 0, 3, 3, "aa", "aa", 8, 0.5, workers=(good, bad)).matched


class _Tensors:
    """A rollout engine reduced to its weights (the seam the receivers load into)."""

    def __init__(self, named):
        self.tensors = {n: torch.zeros_like(t) for n, t in named}
        self.version = 0

    def load_weights(self, named, version, verify=True):
        for n, t in named:
            self.tensors[n].copy_(t)
        self.version = version
        return WeightReport(version, fingerprint(self.tensors.items()) if verify else "", 0)

    def weight_version(self):
        return self.version


@pytest.mark.parametrize("double_buffer", [True, False])
def test_a_gloo_broadcast_in_small_buckets_delivers_every_tensor(double_buffer):
    cfg = validate_config({"weight_sync": {"type": "broadcast", "bucket_mb": 1,
                                           "double_buffer": double_buffer}}).weight_sync
    g = torch.Generator().manual_seed(1)
    named = [("a", torch.randn(700_001, generator=g)),          # 2.7 MiB: spans 3 buckets
             ("b", torch.randn(3, 5, generator=g).to(torch.bfloat16)),
             ("c", torch.randn(300_000, generator=g).double())]
    sender = build_sender(cfg, world_size=3)
    engines = [_Tensors(named) for _ in range(2)]
    reports, receivers = [None, None], [None, None]

    def worker(rank):
        receivers[rank - 1] = build_receiver(cfg, sender.join_info(), rank)

    def receive(rank, ticket):
        reports[rank - 1] = receivers[rank - 1].receive(ticket, engines[rank - 1])

    threads = [threading.Thread(target=worker, args=(r,)) for r in (1, 2)]
    [t.start() for t in threads]
    sender.connect()
    [t.join() for t in threads]
    for version in (1, 2):
        named = [(n, t + version) for n, t in named]
        ticket = sender.prepare(named, version)
        threads = [threading.Thread(target=receive, args=(r, ticket)) for r in (1, 2)]
        [t.start() for t in threads]
        sender.transfer()
        [t.join() for t in threads]
        assert [r.fingerprint for r in reports] == [fingerprint(named)] * 2
        assert [r.version for r in reports] == [version] * 2


def test_in_place_hands_the_learners_own_tensors_to_the_engine():
    cfg = validate_config({}).weight_sync
    named = [("a", torch.randn(5)), ("b", torch.randn(2, 3))]
    engine = _Tensors(named)
    ticket = build_sender(cfg).prepare(named, 7)
    assert ticket.layout.payload_bytes == 4 * (5 + 6)
    assert all(t is u for (_, t), (_, u) in zip(ticket.payload, named, strict=True))
    report = build_receiver(cfg).receive(ticket, engine)
    assert (report.version, report.fingerprint) == (7, fingerprint(named))


def test_in_place_on_a_ray_placement_is_refused_with_the_transports_to_use():
    with pytest.raises(ConfigError, match='weight_sync.type="in_place" copies weights inside '
                                          'one process.*"shm"'):
        validate_config({"placement": {"type": "disaggregated"}})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal a CPU box gives")
def test_cuda_ipc_on_a_cpu_box_is_refused_with_the_fix():
    cfg = validate_config({"weight_sync": {"type": "cuda_ipc"}}).weight_sync
    for build in (lambda: build_sender(cfg), lambda: build_receiver(cfg)):
        with pytest.raises(TransportUnavailable, match=r'weight_sync.type = "cuda_ipc".*"shm"'):
            build()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal a CPU box gives")
@pytest.mark.parametrize("backend", ["nccl", "ipc"])
def test_vllm_native_cuda_backends_on_a_cpu_box_are_refused_with_the_fix(backend):
    placement = {"nccl": "disaggregated", "ipc": "colocated"}[backend]
    cfg = validate_config({"rollout": {"type": "vllm"}, "placement": {"type": placement},
                           "weight_sync": {"type": "vllm_native", "backend": backend}}
                          ).weight_sync
    fix = rf'weight_sync.backend = "{backend}" .*no GPU.*weight_sync.backend = "gloo"'
    with pytest.raises(TransportUnavailable, match=fix):
        build_sender(cfg)
    with pytest.raises(TransportUnavailable, match=fix):
        build_receiver(cfg, {}, 1, engine=object())


@pytest.mark.parametrize("overrides, fix", [
    ({"rollout": {"type": "torch"}}, r'rollout.type="torch"; set rollout.type = "vllm"'),
    ({"rollout": {"type": "vllm", "tensor_parallel_size": 2}, "placement": {"devices": 2}},
     r'tensor_parallel_size=2.*set rollout.tensor_parallel_size = 1, or weight_sync.type = '
     r'"broadcast", "shm" or "in_place"'),
    ({"rollout": {"type": "vllm"}, "faults": {"skip_weight_sync": {}}},
     r'faults.skip_weight_sync.*weight_sync.type = "broadcast"'),
    ({"rollout": {"type": "vllm"}, "weight_sync": {"type": "vllm_native", "backend": "nccl"}},
     r'weight_sync.backend.*two ranks on one GPU.*placement.type = "disaggregated"'),
    ({"rollout": {"type": "vllm"}, "placement": {"type": "disaggregated"},
      "weight_sync": {"type": "vllm_native", "backend": "ipc"}},
     r'weight_sync.backend.*share the GPU.*weight_sync.backend = "nccl"'),
])
def test_vllm_native_settings_that_cannot_work_are_refused_naming_the_fix(overrides, fix):
    with pytest.raises(ConfigError, match=fix):
        validate_config({"weight_sync": {"type": "vllm_native"}, **overrides})


def test_transport_settings_are_bounded_and_errors_name_their_section():
    with pytest.raises(ConfigError, match=r"weight_sync.bucket_mb: .*greater than or equal"):
        validate_config({"weight_sync": {"type": "broadcast", "bucket_mb": 0}})
    with pytest.raises(ConfigError, match=r"weight_sync.backend"):
        validate_config({"weight_sync": {"type": "broadcast", "backend": "mpi"}})
    # "checkpoint" is both a weight-sync type and a run section; each error keeps its path
    with pytest.raises(ConfigError, match=r"  weight_sync.keep_last: "):
        validate_config({"weight_sync": {"type": "checkpoint", "keep_last": 0}})
    with pytest.raises(ConfigError, match=r"  checkpoint.keep_last: "):
        validate_config({"checkpoint": {"keep_last": 0}})


def test_a_shared_memory_directory_too_small_for_the_weights_is_refused(monkeypatch, tmp_path):
    import os

    from engine.weightsync import shm

    class _Full:
        f_bavail, f_frsize = 10, 4096
    monkeypatch.setattr(shm.os, "statvfs", lambda path: _Full)
    cfg = validate_config({"weight_sync": {"type": "shm",
                                           "directory": str(tmp_path)}}).weight_sync
    with pytest.raises(TransportUnavailable, match=r"weight_sync.directory = .* 0 MB free"):
        build_sender(cfg).prepare([("w", torch.zeros(2**20))], 1)
    assert os.listdir(tmp_path) == []


def test_a_killed_learners_shared_memory_file_is_removed_by_the_next_sender(tmp_path):
    import fcntl
    import os
    import socket
    import time

    host = socket.gethostname()
    files = {k: tmp_path / f"rlplane-weights-{host}-{pid}-{k}1"
             for k, pid in [("orphan", 999999), ("locked", 12), ("fresh", 13)]}
    files["elsewhere"] = tmp_path / f"rlplane-weights-{host}-7-12-x1"   # host "<host>-7"
    for f in files.values():
        f.write_bytes(b"\0" * 64)
    old = time.time() - 3600
    for k in ("orphan", "locked", "elsewhere"):
        os.utime(files[k], (old, old))
    holder = os.open(files["locked"], os.O_RDONLY)      # a live sender holds its lock
    fcntl.flock(holder, fcntl.LOCK_EX)
    cfg = validate_config({"weight_sync": {"type": "shm",
                                           "directory": str(tmp_path)}}).weight_sync
    sender = build_sender(cfg)

    sender.prepare([("w", torch.zeros(16))], 1)

    kept = {f.name for k, f in files.items() if k != "orphan"}
    left = set(os.listdir(tmp_path))
    assert files["orphan"].name not in left and kept <= left
    assert len(left) == 4                                    # + this sender's own buffer
    sender.close()
    assert set(os.listdir(tmp_path)) == kept
    os.close(holder)


class _Logged(_Tensors):
    def __init__(self, named, log):
        super().__init__(named)
        self.log = log

    def load_weights(self, named, version, verify=True):
        self.log.append(f"worker loaded {version}")
        return super().load_weights(named, version, verify)


def test_a_learner_hashing_after_the_workers_load_hashes_the_version_it_sent(tmp_path):
    from engine.orchestration.actors import ThreadActor
    from engine.weightsync.session import EngineHost, TensorSource, WeightSyncSession

    log = []

    class Source(TensorSource):
        def weights_fingerprint(self, named):
            log.append(f"learner hashed {self.version}")
            return super().weights_fingerprint(named)

        def update(self):                   # what the learner's next step does
            for _, t in self.named:
                t.add_(1)
            self.version += 1

    named = [(n, t.contiguous()) for n, t in _mixed() if t.is_floating_point()]
    source, engine = Source([(n, t.clone()) for n, t in named], 1), _Logged(named, log)
    cfg = validate_config({"weight_sync": {"type": "shm",
                                           "directory": str(tmp_path)}}).weight_sync
    learner = ThreadActor(source, 1, "learner")
    session = WeightSyncSession(learner, [ThreadActor(EngineHost(engine), 1)], cfg)
    session.connect()
    session.send(1, initial=True)
    session.settle(wait=True)
    for _, t in source.named:           # the learner's update before the second sync
        t.mul_(2)
    sent = fingerprint(source.named)
    log.clear()

    source.version = 2
    session.send(2, hash_after_load=True)
    session.await_served()
    updated = learner.call(Source.update)     # queued behind the hash await_served queued

    [res] = session.settle(wait=True)
    assert log == ["worker loaded 2", "learner hashed 2"]     # never beside the load
    assert res.matched and res.version_learner == 2
    assert res.fingerprint_learner == res.fingerprint_rollout == sent  # not the update's
    updated.result()
    assert fingerprint(source.named) != sent
    source.close_sender()
