"""Driving the loop's WeightSyncSession from a test: tensors in this process (a
TensorSource as the learner), rollout engines in Ray actors (EngineHost subclasses)."""

from engine.config import InPlaceSyncConfig
from engine.orchestration.actors import LocalActor, RayActor
from engine.weightsync.session import EngineHost, TensorSource, WeightSyncSession


def connect(cfg, workers, source: TensorSource | None = None):
    """A connected session from ``source`` (default: an empty TensorSource) to the Ray
    actor handles ``workers``; returns (session, source)."""
    source = source if source is not None else TensorSource([])
    session = WeightSyncSession(LocalActor(source), [RayActor(w) for w in workers], cfg)
    session.connect()
    return session, source


def push(session, source, named, version, initial=False):
    """One sync of ``named`` as ``version``; its SyncResult (raises what a worker raised)."""
    source.named, source.version = list(named), version
    session.send(version, initial)
    [res] = session.settle(wait=True)
    return res


def sync_in_place(engine, named, version):
    """The in-process path the colocated loop takes: one in_place sync into ``engine``."""
    session = WeightSyncSession(LocalActor(TensorSource(named, version)),
                                [LocalActor(EngineHost(engine))], InPlaceSyncConfig())
    session.connect()
    session.send(version, initial=True)
    [res] = session.settle(wait=True)
    return res
