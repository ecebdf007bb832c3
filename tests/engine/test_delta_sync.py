"""Delta weight sync, verify_every and the XXH3 fingerprint, without Ray: the session
drives real shm and gloo-broadcast transports into in-process engines (LocalActor)."""

import threading

import pytest
import torch

from engine.config import ConfigError, validate_config
from engine.orchestration.actors import LocalActor
from engine.rollout.base import WeightReport
from engine.telemetry.step_metrics import sync_metrics
from engine.weightsync import build_receiver, build_sender
from engine.weightsync.delta import DeltaBaseError, DeltaDecoder, DeltaEncoder
from engine.weightsync.fingerprint import fingerprint
from engine.weightsync.layout import FlatLayout
from engine.weightsync.session import EngineHost, TensorSource, WeightSyncSession

from .test_transports_units import _Tensors  # the same seam: an engine reduced to weights


def _weights(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [("embed", torch.randn(300, 64, generator=g).to(dtype)),
            ("odd", torch.randn(7, generator=g).to(dtype)),           # not a multiple of 8
            ("head", torch.randn(64, 300, generator=g).to(dtype)),
            ("step", torch.tensor([3], dtype=torch.int64))]


def _step(named, seed, scale=1e-3):
    """An optimizer-like update: every float element moves a little."""
    g = torch.Generator().manual_seed(seed)
    return [(n, (t.float() + torch.randn(t.shape, generator=g) * scale * t.float().abs())
             .to(t.dtype) if t.is_floating_point() else t + 1) for n, t in named]


def _session(cfg, named, workers=2, directory=None):
    source = TensorSource(named, 0)
    engines = [_Tensors(named) for _ in range(workers)]
    hosts = [EngineHost(e) for e in engines]
    session = WeightSyncSession(LocalActor(source), [LocalActor(h) for h in hosts], cfg)
    session.connect()
    return session, source, engines, hosts


def _push(session, source, named, version, initial=False):
    source.named, source.version = list(named), version
    session.send(version, initial)
    [res] = session.settle(wait=True)
    return res


def _serves(engine, named):
    return all(torch.equal(engine.tensors[n], t) for n, t in named)


def _shm(tmp_path, **kw):
    return validate_config({"weight_sync": {"type": "shm", "directory": str(tmp_path),
                                            **kw}}).weight_sync


# --------------------------------------------------------------------------- fingerprint

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_fingerprint_matches_equal_weights_and_detects_a_one_ulp_change(dtype):
    named = _weights(dtype)
    assert fingerprint(named) == fingerprint([(n, t.clone()) for n, t in named])
    assert len(fingerprint(named)) == 32                       # all 128 bits of XXH3-128
    t = named[0][1].clone()
    flat = t.view(-1)
    flat[1234] = torch.nextafter(flat[1234].float(), torch.tensor(float("inf"))).to(dtype) \
        if dtype == torch.float32 else \
        (flat[1234:1235].view(torch.int16) + 1).view(dtype)[0]    # one ulp in 16 bits
    assert (t != named[0][1]).sum() == 1
    assert fingerprint([(named[0][0], t), *named[1:]]) != fingerprint(named)


def test_the_fingerprint_sees_names_dtypes_and_shapes_not_only_bytes():
    w = torch.arange(6, dtype=torch.float32)
    base = fingerprint([("w", w)])
    assert fingerprint([("v", w)]) != base
    assert fingerprint([("w", w.reshape(2, 3))]) != base
    assert fingerprint([("w", w.view(torch.int32))]) != base


# --------------------------------------------------------------------------- the codec

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_decoded_delta_equals_the_new_weights_bit_for_bit(dtype):
    old, new = _weights(dtype), _step(_weights(dtype), 1)
    layout = FlatLayout.of(old)
    enc, dec = DeltaEncoder(), DeltaDecoder()
    frame, wire = enc.encode(old, layout, 1, None)
    assert frame.base is None and wire is None                   # nothing to XOR against
    dec.take_full(enc.full_stream(), layout, 1)
    frame, wire = enc.encode(new, layout, 2, 1)
    assert frame.base == 1 and frame.wire_bytes == wire.numel() < layout.payload_bytes
    dec.apply(frame, wire.numpy(), layout, 2)
    assert fingerprint(layout.views(dec.current)) == fingerprint(new)
    assert 0 < frame.changed <= frame.elements == sum(t.numel() for _, t in new)


def test_an_encoder_asked_for_a_base_it_did_not_send_sends_the_full_stream():
    named = _weights()
    layout = FlatLayout.of(named)
    enc = DeltaEncoder()
    enc.encode(named, layout, 1, None)
    frame, wire = enc.encode(_step(named, 2), layout, 2, base=0)   # workers serve v0
    assert frame.base is None and wire is None


# --------------------------------------------------------------------------- through shm

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shm_delta_syncs_deliver_the_learners_exact_weights(tmp_path, dtype):
    named = _weights(dtype)
    session, source, engines, _ = _session(_shm(tmp_path, delta=True), named)
    res = _push(session, source, named, 0, initial=True)
    assert res.matched and res.delta.base is None and res.wire_bytes == res.bytes
    for version in range(1, 4):
        named = _step(named, version)
        res = _push(session, source, named, version)
        assert res.matched and res.fingerprint_learner == fingerprint(named)
        assert res.delta.base == version - 1 and res.wire_bytes < res.bytes
        assert 0 < res.changed_frac <= 1
        assert all(_serves(e, named) for e in engines)
    m = sync_metrics(res)
    assert m["weight_sync/wire_bytes"] == res.wire_bytes < m["weight_sync/bytes"]
    assert m["weight_sync/delta_density"] == res.changed_frac
    session.learner.obj.close_sender()


def test_a_worker_not_at_the_base_version_takes_the_full_weights_from_the_same_sync(tmp_path):
    """A restarted worker (a fresh receiver: no base) in a delta sync reads the full
    stream the shm file also holds; the others apply the XOR; all serve the same bytes."""
    named = _weights()
    session, source, engines, hosts = _session(_shm(tmp_path, delta=True), named)
    _push(session, source, named, 0, initial=True)
    named = _step(named, 1)
    _push(session, source, named, 1)
    hosts[1].setup_weight_receiver(session.cfg, None, 2)         # the worker restarted
    named = _step(named, 2)
    res = _push(session, source, named, 2)
    assert res.delta.base == 1 and res.matched
    assert all(_serves(e, named) for e in engines)


def test_after_a_refused_sync_the_next_one_is_sent_in_full(tmp_path):
    from engine.weightsync.base import StaleVersionError

    named = _weights()
    session, source, engines, _ = _session(_shm(tmp_path, delta=True), named)
    _push(session, source, named, 5, initial=True)
    with pytest.raises(StaleVersionError):
        _push(session, source, _step(named, 1), 4)               # a version gap backwards
    named = _step(named, 2)
    res = _push(session, source, named, 6)
    assert res.delta.base is None and res.matched and all(_serves(e, named) for e in engines)


def test_a_mismatched_sync_makes_the_next_one_full(tmp_path):
    named = _weights()
    session, source, engines, hosts = _session(_shm(tmp_path, delta=True), named)
    _push(session, source, named, 0, initial=True)

    class SkipsOne(_Tensors):       # takes the version, leaves one tensor behind
        def load_weights(self, named, version, verify=True):
            return super().load_weights([(n, t) for n, t in named if n != "odd"], version,
                                        verify)

    real, hosts[0].engine = hosts[0].engine, SkipsOne(named)
    res = _push(session, source, _step(named, 1), 1)
    assert res.delta.base == 0 and not res.matched
    hosts[0].engine = real
    named = _step(named, 2)
    res = _push(session, source, named, 2)
    assert res.delta.base is None and res.matched and all(_serves(e, named) for e in engines)


def test_adopting_parameters_with_delta_is_refused_with_the_fix(tmp_path):
    from engine.weightsync.base import TransportUnavailable

    sender = build_sender(_shm(tmp_path, delta=True))
    with pytest.raises(TransportUnavailable, match="set delta = false to adopt"):
        sender.adopt(_weights())


# --------------------------------------------------------------------------- verify_every

def test_verify_every_n_fingerprints_the_first_and_every_nth_sync_only(tmp_path):
    named = _weights()
    session, source, engines, _ = _session(_shm(tmp_path, verify_every=3), named)
    verified = []
    for version in range(7):
        named = _step(named, version)
        res = _push(session, source, named, version, initial=version == 0)
        verified.append(res.verified)
        assert res.matched and all(_serves(e, named) for e in engines)
        if not res.verified:
            assert res.fingerprint_learner == res.fingerprint_rollout == ""
            assert {r.fingerprint for r in res.workers} == {""}
        else:
            assert res.fingerprint_learner == fingerprint(named)
        assert sync_metrics(res)["weight_sync/verified"] == float(res.verified)
        assert res.event().verified == res.verified
    assert verified == [True, False, False, True, False, False, True]


def test_an_unverified_sync_still_reports_a_worker_left_behind(tmp_path):
    named = _weights()
    session, source, engines, hosts = _session(_shm(tmp_path, verify_every=5), named)
    _push(session, source, named, 0, initial=True)

    class Stuck(_Tensors):          # takes nothing, keeps its version
        def load_weights(self, named, version, verify=True):
            return WeightReport(self.version, "", 0)

    hosts[0].engine = Stuck(named)
    res = _push(session, source, _step(named, 1), 1)
    assert not res.verified and not res.matched and res.version_rollout == 0
    assert "unverified" in res.mismatch()


def test_the_learner_hashes_what_it_sent_after_the_transfer_and_before_it_changes(tmp_path):
    """The learner's fingerprint is off the sync's critical path (after transfer, while the
    workers load) yet still of the version sent; the sync ends when both ends' are in."""
    calls = []

    class Recording(TensorSource):
        def prepare(self, *a, **kw):
            calls.append("prepare")
            return super().prepare(*a, **kw)

        def transfer(self, step):
            calls.append("transfer")
            super().transfer(step)

        def weights_fingerprint(self, named):
            calls.append("fingerprint")
            return super().weights_fingerprint(named)

    named = _weights()
    source = Recording(named, 0)
    engines = [_Tensors(named)]
    session = WeightSyncSession(LocalActor(source), [LocalActor(EngineHost(engines[0]))],
                                _shm(tmp_path))
    session.connect()
    for version in range(3):
        named = _step(named, version)
        res = _push(session, source, named, version, initial=version == 0)
        assert res.matched and res.fingerprint_learner == fingerprint(named)
        assert res.verify_latency_s >= res.latency_s > 0
    assert calls == ["prepare", "transfer", "fingerprint"] * 3


def test_a_failed_prepare_surfaces_its_own_error_not_the_missing_fingerprint(tmp_path):
    named = _weights()
    session, source, _, _ = _session(_shm(tmp_path), named)
    source.sync_weights = lambda: (_ for _ in ()).throw(RuntimeError("gather failed"))
    with pytest.raises(RuntimeError, match="gather failed"):
        session.send(1, initial=True)
    with pytest.raises(RuntimeError, match="prepare failed"):
        source.sent_fingerprint(1)


# --------------------------------------------------------------------------- broadcast

def _broadcast_pair(cfg, named):
    sender = build_sender(cfg, world_size=2)
    box = {}
    t = threading.Thread(target=lambda: box.update(r=build_receiver(cfg, sender.join_info(), 1)))
    t.start()
    sender.connect()
    t.join()
    return sender, box["r"], _Tensors(named)


def _broadcast_sync(sender, receiver, engine, named, version, base):
    ticket = sender.prepare(named, version, base=base)
    out = {}

    def run():
        try:
            out["report"] = receiver.receive(ticket, engine)
        except Exception as e:          # noqa: BLE001 - handed to the test thread
            out["error"] = e
    t = threading.Thread(target=run)
    t.start()
    sender.transfer()
    t.join()
    return ticket, out


def test_a_gloo_broadcast_delta_round_trips_and_a_gap_is_refused_after_the_collective():
    cfg = validate_config({"weight_sync": {"type": "broadcast", "bucket_mb": 1,
                                           "delta": True}}).weight_sync
    named = _weights(torch.bfloat16)
    sender, receiver, engine = _broadcast_pair(cfg, named)
    ticket, out = _broadcast_sync(sender, receiver, engine, named, 1, None)
    assert ticket.delta.base is None and out["report"].fingerprint == fingerprint(named)
    named = _step(named, 2)
    ticket, out = _broadcast_sync(sender, receiver, engine, named, 2, 1)
    assert ticket.delta.base == 1 and ticket.wire_bytes < ticket.layout.payload_bytes
    assert out["report"].fingerprint == fingerprint(named) and _serves(engine, named)
    receiver._delta.version = 0                         # as if it had missed version 2
    _, out = _broadcast_sync(sender, receiver, engine, _step(named, 3), 3, 2)
    assert isinstance(out["error"], DeltaBaseError)
    assert "fall back to a full send" in str(out["error"])
    sender.close()
    receiver.close()


# --------------------------------------------------------------------------- config

@pytest.mark.parametrize("kind", ["in_place", "checkpoint", "cuda_ipc"])
def test_delta_on_a_transport_that_moves_no_bytes_of_its_own_is_refused_naming_the_fix(kind):
    with pytest.raises(ConfigError, match=rf'weight_sync.*"{kind}".*"shm", "object_store" '
                                          r'or "broadcast", or set delta = false'):
        validate_config({"weight_sync": {"type": kind, "delta": True}})


def test_verify_every_is_bounded_and_defaults_to_every_sync():
    assert validate_config({}).weight_sync.verify_every == 1
    with pytest.raises(ConfigError, match=r"weight_sync.verify_every: .*greater than or equal"):
        validate_config({"weight_sync": {"type": "shm", "verify_every": 0}})


def test_delta_over_nccl_is_refused_naming_the_fix():
    from engine.weightsync.base import TransportUnavailable

    cfg = validate_config({"weight_sync": {"type": "broadcast", "backend": "nccl",
                                           "delta": True}}).weight_sync
    with pytest.raises(TransportUnavailable, match='use backend = "gloo" with delta'):
        build_sender(cfg)
