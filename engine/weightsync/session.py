"""The weight-sync session: learner -> every rollout worker, versioned and verified, for
every transport (in place included). The loop, the tests and the benches all drive this.

    session = WeightSyncSession(learner, workers, cfg.weight_sync)   # actor handles
    session.connect()                   # once: each worker's receiver joins the sender
    session.send(step, initial=True)    # queue the learner's current weights to every worker
    for res in session.settle(wait=True):           # syncs whose every worker answered
        res.matched, res.latency_s, res.bytes, res.gb_per_s

    learner (rank 0, WeightSenderHost)        rollout workers (rank 1..n, WeightReceiverHost)
    prepare(step) -> ticket          ------>  receive_weights(ticket, step)   (every rank is
    transfer(step)  =====bytes=====>            load into the engine,          queued before
    sent_fingerprint(step) -> meta              fingerprint what it serves     transfer: a
    settle: meta + reports          <------     Served(WeightReport(v, fp), at)  broadcast
                                                                  needs them all)

The learner fingerprints what it sent after the bytes are on their way (sent_fingerprint,
queued behind transfer), while the workers load theirs: its hash is off the sync's critical
path instead of ahead of every byte. With ``send(..., hash_after_load=True)`` it is queued
once every worker has answered (``await_served``), so its pass over the weights no longer
shares the memory bandwidth of their loads (bench/weight_sync.py "after": the time until
the worker serves a verified sync on the small preset, 1.04-1.08x an unverified one's,
against 1.14-1.18x hashing beside it), and the loop gathers the step's metrics while it
hashes. Either way it hashes the version it sent: the call is queued before any later
update of the learner's, and it holds the very tensors prepare sent.

Calls to one actor run in submit order, so a ``produce`` queued after ``send`` generates
with the new weights, and ``send`` returns before the workers have them (the overlapped
policies settle later; the others wait). One sync is in flight at a time: ``send`` first
settles the previous one, since a sender may reuse its buffers and the learner must not
change the tensors a transfer still reads.

A rollout worker that dies during a sync (its call fails with ActorLost), or is still
loading the weights ``cfg.timeout_s`` after it began (it says how long, on its telemetry
group: ``loading_for``), is left out of that sync's result and handed to ``on_lost``
(the loop kills and replaces it); without ``on_lost`` the error is the sync's and a
wedged sync is waited for. ``rejoin(i, worker, step)`` puts a new worker in place i and
sends it the learner's current weights alone, verified, and ``join(worker, step)`` adds
one in a new last place the same way: a point-to-point transport takes a new receiver at
any time; a collective one (its world fixed at connect) cannot. ``leave(i)`` takes the
last worker out (its answer to a sync in flight awaited first).

One definition of the numbers a sync reports (SyncResult): ``bytes`` is the payload each
worker receives; ``latency_s`` runs from ``send`` (the learner's new version exists) to
the last worker serving it; ``gb_per_s`` is gigabytes (1e9 bytes) per second of that.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from engine.config.weightsync import COLLECTIVE_TRANSPORTS
from engine.orchestration.actors import ActorLost, concurrent
from engine.rollout.base import WeightReport
from engine.telemetry.recorder import SpanRecorder
from engine.weightsync import build_receiver, build_sender
from engine.weightsync.base import SyncResult, Ticket
from engine.weightsync.fingerprint import fingerprint


@dataclass(frozen=True)
class WeightMeta:
    """The learner's side of one sync: the version it sent, its fingerprint ("" when the
    sync is not verified) and when that fingerprint was done (time.time())."""
    version: int
    fingerprint: str
    at: float = 0.0


@dataclass(frozen=True)
class Served:
    """A rollout worker's report after loading weights, and when it began serving them."""
    report: WeightReport
    at: float


class WeightSenderHost:
    """The learner actor's end. The host class provides ``rec`` (a SpanRecorder),
    ``sync_version()`` and ``sync_weights() -> (version, named_tensors)`` (which may be a
    collective: a sharded learner gathers its full tensors)."""

    rec: SpanRecorder

    def sync_version(self) -> int:
        raise NotImplementedError

    def sync_weights(self) -> tuple[int, list[tuple[str, torch.Tensor]]]:
        raise NotImplementedError

    def weights_fingerprint(self, named: Sequence[tuple[str, torch.Tensor]]) -> str:
        return fingerprint(named)

    def setup_sender(self, cfg, world_size: int) -> object:
        """Build the sender; returns what receivers join with (None unless collective)."""
        self.sender = build_sender(cfg, world_size)
        self.sync_delta = cfg.delta
        self._sent = None       # (version, tensors or None) of the last prepare
        return self.sender.join_info()

    def connect(self) -> None:
        self.sender.connect()

    def prepare(self, step: int, initial: bool, verify: bool = True,
                base: int | None = None) -> Ticket:
        """``base``: the version every worker serves (weight_sync.delta sends the XOR
        against it when the sender last sent that version; None: a full send)."""
        self._sent = None
        with self.rec.phase("weight_sync", step, self.sync_version()):
            version, named = self.sync_weights()
            if self.sync_delta:
                ticket = self.sender.prepare(named, version, initial, base=base)
            else:
                ticket = self.sender.prepare(named, version, initial)
            self._sent = (version, named if verify else None)
            return dataclasses.replace(ticket, verify=verify)

    def transfer(self, step: int) -> None:
        with self.rec.phase("weight_sync", step, self.sync_version()):
            self.sender.transfer()

    def sent_fingerprint(self, step: int) -> WeightMeta:
        """The fingerprint of the tensors the last ``prepare`` sent ("" if unverified)."""
        if self._sent is None:
            raise RuntimeError("no weights to fingerprint: this sync's prepare failed "
                               "(its error is the sync's)")
        (version, named), self._sent = self._sent, None   # a gathered copy can go now
        with self.rec.phase("weight_sync", step, version):
            fp = self.weights_fingerprint(named) if named is not None else ""
        return WeightMeta(version, fp, time.time())

    def close_sender(self) -> None:
        if hasattr(self, "sender"):
            self.sender.close()


class WeightReceiverHost:
    """A rollout-worker actor's end. The host class provides ``engine`` (its rollout
    engine) and ``rec`` (a SpanRecorder)."""

    rec: SpanRecorder
    loading_since: float | None = None    # time.time() the sync being loaded began

    def setup_weight_receiver(self, cfg, join_info: object, rank: int) -> None:
        self.receiver = build_receiver(cfg, join_info, rank, self.engine)

    def receive_weights(self, ticket: Ticket, step: int) -> Served:
        self.step = step                  # the step in progress, which faults key on
        self.loading_since = time.time()
        try:
            with self.rec.phase("weight_sync", step, ticket.version):
                report = self.receiver.receive(ticket, self.engine)
        finally:
            self.loading_since = None
        return Served(report, time.time())

    @concurrent("telemetry")      # answers while receive_weights runs (or hangs)
    def loading_for(self) -> float | None:
        """Seconds this worker has been loading a sync's weights (None: it loads none), by
        its own clock."""
        since = self.loading_since
        return None if since is None else time.time() - since

    def close_receiver(self) -> None:
        if hasattr(self, "receiver"):
            self.receiver.close()


@dataclass
class _Pending:
    step: int
    sent_at: float
    meta: object          # future -> WeightMeta (None: queued once the workers answered)
    ticket: object        # future -> Ticket
    served: list          # futures -> Served, one per worker
    workers: list         # the handles they were sent to (a replaced one may be gone)
    answers: list | None = None    # the Served of each (None: lost), once awaited


class WeightSyncSession:
    """``cfg.verify_every = N`` fingerprints the first sync and every Nth after it; the
    others are matched on versions alone (SyncResult.verified False). With ``cfg.delta``
    a sync is sent as an XOR against the version every worker reported serving after the
    last sync, and in full after a version gap or a mismatch (engine/weightsync/delta.py)."""

    def __init__(self, learner, workers: Sequence, cfg,
                 on_lost: Callable[[int, object, str], None] | None = None):
        self.learner, self.workers, self.cfg = learner, list(workers), cfg
        self.on_lost = on_lost           # (index, handle, cause) of a worker that died
        self._join_info: object = None
        self._pending: list[_Pending] = []
        self._settled: list[SyncResult] = []
        self._sends = 0
        self._last: SyncResult | None = None     # the newest settled sync

    def _delta_base(self) -> int | None:
        """The version every worker serves, if the last sync reached them all intact."""
        last = self._last
        if last is None or not last.matched or not last.workers:
            return None
        versions = {r.version for r in last.workers}
        return versions.pop() if len(versions) == 1 else None

    def connect(self) -> None:
        info = self._join_info = self.learner.call(WeightSenderHost.setup_sender, self.cfg,
                                                   1 + len(self.workers)).result()
        setups = [w.call(WeightReceiverHost.setup_weight_receiver, self.cfg, info, rank)
                  for rank, w in enumerate(self.workers, start=1)]
        self.learner.call(WeightSenderHost.connect)    # collective for a broadcast: concurrent
        for f in setups:
            f.result()

    def send(self, step: int, initial: bool = False, hash_after_load: bool = False) -> None:
        """Queue the learner's current weights to every worker, behind the calls already
        queued on them; the reports come back through ``settle``.

        ``hash_after_load``: the learner fingerprints what it sent once every worker has
        loaded it (queued by ``await_served`` or ``settle``), not while they load: its pass
        over the weights then shares no memory bandwidth with theirs, and a caller that
        has other work before it needs the result (the loop's step metrics) waits for
        the workers alone. The caller must then call one of them before any call that
        changes the learner's weights."""
        self._collect(wait=True)
        verify = initial or self._sends % self.cfg.verify_every == 0
        self._sends += 1
        sent_at = time.time()
        ticket = self.learner.call(WeightSenderHost.prepare, step, initial, verify,
                                   None if initial else self._delta_base())
        served = [w.call(WeightReceiverHost.receive_weights, ticket, step)
                  for w in self.workers]
        self.learner.call(WeightSenderHost.transfer, step)
        meta = None if hash_after_load else \
            self.learner.call(WeightSenderHost.sent_fingerprint, step)
        self._pending.append(_Pending(step, sent_at, meta, ticket, served, list(self.workers)))

    def await_served(self) -> None:
        """Wait until every worker has answered each sync in flight, and queue the
        learner's fingerprint of those sent with ``hash_after_load``: it hashes while the
        caller goes on, and ``settle`` returns the results."""
        for p in list(self._pending):
            self._answers(p)

    def rejoin(self, index: int, worker, step: int) -> SyncResult:
        """``worker`` takes place ``index`` (a dead worker's): it joins the transport and
        receives the learner's current weights, fingerprinted on both ends; the result
        is that one worker's (SyncResult.matched: it serves what the learner sent)."""
        self._refuse_collective("a run that must survive a lost worker")
        self._collect(wait=True)                 # no sync in flight: the sender is free
        self.workers[index] = worker
        return self._welcome(index, worker, step)

    def join(self, worker, step: int) -> SyncResult:
        """``worker`` joins as one more, in the last place, once it has received the
        learner's current weights (fingerprinted on both ends, as ``rejoin``); a worker
        whose setup or sync fails is not added (its error propagates)."""
        self._refuse_collective("a run that resizes its rollout workers live")
        self._collect(wait=True)
        res = self._welcome(len(self.workers), worker, step)
        self.workers.append(worker)
        return res

    def leave(self, index: int) -> None:
        """The worker in place ``index``, the last, leaves: its answer to each sync in
        flight is awaited (a lost one goes to ``on_lost``) and left out of that sync's
        result, which the other workers' answers make."""
        worker = self.workers[index]
        for p in self._pending:
            at = next((i for i, w in enumerate(p.workers) if w is worker), None)
            if at is not None:
                if p.answers is None:
                    self._served(p, at)
                else:
                    del p.answers[at]
                del p.served[at], p.workers[at]
        del self.workers[index]

    def _refuse_collective(self, who: str) -> None:
        if self.cfg.type in COLLECTIVE_TRANSPORTS:
            raise RuntimeError(
                f'weight_sync.type = "{self.cfg.type}" joins the learner and every rollout '
                f"worker in one process group, fixed when the run starts, so no new worker "
                f'can join it; {who} needs "object_store" or "shm"')

    def _welcome(self, index: int, worker, step: int) -> SyncResult:
        """The learner's current weights to ``worker`` (rank ``index`` + 1) alone, verified."""
        worker.call(WeightReceiverHost.setup_weight_receiver, self.cfg, self._join_info,
                    index + 1).result()
        sent_at = time.time()
        ticket = self.learner.call(WeightSenderHost.prepare, step, True, True, None)
        served = worker.call(WeightReceiverHost.receive_weights, ticket, step)
        self.learner.call(WeightSenderHost.transfer, step)
        meta = self.learner.call(WeightSenderHost.sent_fingerprint, step).result()
        ticket, served = ticket.result(), served.result()
        self._last = None        # the others' delta base is not the new worker's: go full
        return SyncResult(
            transport=ticket.transport, step=step, version_learner=meta.version,
            version_rollout=served.report.version, fingerprint_learner=meta.fingerprint,
            fingerprint_rollout=served.report.fingerprint, bytes=ticket.layout.payload_bytes,
            latency_s=served.at - sent_at, verify_latency_s=max(meta.at, served.at) - sent_at,
            workers=(served.report,), wire_bytes=ticket.wire_bytes)

    def quiesce(self) -> None:
        """Wait until every queued sync has been received (their results kept for the next
        ``settle``): the sender's tensors may change after this."""
        self._collect(wait=True)

    def settle(self, wait: bool) -> list[SyncResult]:
        """The syncs whose every worker has answered, oldest first (all when ``wait``)."""
        self._collect(wait)
        out, self._settled = self._settled, []
        return out

    def _answers(self, p: _Pending) -> list[Served | None]:
        """Each worker's answer to ``p`` (None: lost, handed to on_lost), awaited once; then
        the learner's fingerprint is queued if it waited for them. A failed sync leaves."""
        try:
            if p.answers is None:
                p.ticket.result()                                   # prepare's error first
                p.answers = [self._served(p, i) for i in range(len(p.served))]
            if p.meta is None:
                p.meta = self.learner.call(WeightSenderHost.sent_fingerprint, p.step)
        except BaseException:
            self._pending.remove(p)
            self._last = None            # workers may hold any version: the next is full
            raise
        return p.answers

    def _collect(self, wait: bool) -> None:
        while self._pending and (wait or all(f.done() for f in self._pending[0].served)):
            p = self._pending[0]
            answers = self._answers(p)
            self._pending.pop(0)
            ticket = p.ticket.result()              # _answers has seen it succeed
            try:
                meta = p.meta.result()
            except BaseException:
                self._last = None
                raise
            served = [s for s in answers if s is not None]
            if not served:               # every worker died during it: no one to report
                self._last = None
                continue
            reports = tuple(s.report for s in served)
            differing = [r for r in reports if r.fingerprint != meta.fingerprint]
            self._last = SyncResult(
                transport=ticket.transport, step=p.step, version_learner=meta.version,
                version_rollout=min(r.version for r in reports),
                fingerprint_learner=meta.fingerprint,
                fingerprint_rollout=(differing or reports)[0].fingerprint,
                bytes=ticket.layout.payload_bytes,
                latency_s=max(s.at for s in served) - p.sent_at,
                verify_latency_s=max(meta.at, *(s.at for s in served)) - p.sent_at,
                workers=reports,
                verified=ticket.verify, wire_bytes=ticket.wire_bytes, delta=ticket.delta)
            self._settled.append(self._last)

    def _await(self, served, worker) -> None:
        """Wait for ``served``; ActorLost once ``worker`` has been loading the weights for
        longer than cfg.timeout_s (a wedged sync: verl #3873)."""
        limit = self.cfg.timeout_s
        check = min(1.0, limit / 4)             # how often it asks the worker
        while not served.done(check):
            loading = worker.call(WeightReceiverHost.loading_for).result(10 * check + 5)
            if loading is not None and loading > limit:
                raise ActorLost(f"its weight sync ran past weight_sync.timeout_s = "
                                f"{limit:g} s")

    def _served(self, p: _Pending, i: int) -> Served | None:
        """Worker i's answer to sync ``p``; None when it died meanwhile or was still loading
        it ``cfg.timeout_s`` after it began (on_lost has it)."""
        try:
            if self.on_lost is not None:
                self._await(p.served[i], p.workers[i])
            return p.served[i].result()
        except ActorLost as exc:
            if self.on_lost is None:
                raise
            self.on_lost(i, p.workers[i], exc.cause)
            return None


class TensorSource(WeightSenderHost):
    """A sender host over plain named tensors, for a process that has no learner (a bench,
    a tool that pushes a checkpoint): set ``version`` and ``named`` before each send."""

    def __init__(self, named: Sequence[tuple[str, torch.Tensor]], version: int = 0,
                 devices: Sequence[str] = ()):
        self.named, self.version, self.rec = list(named), version, SpanRecorder(list(devices))

    def sync_version(self) -> int:
        return self.version

    def sync_weights(self) -> tuple[int, list[tuple[str, torch.Tensor]]]:
        return self.version, self.named


class EngineHost(WeightReceiverHost):
    """A receiver host around one rollout engine (anything with load_weights)."""

    def __init__(self, engine, devices: Sequence[str] = ()):
        self.engine, self.rec = engine, SpanRecorder(list(devices))
