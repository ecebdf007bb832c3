"""Weight-sync GB/s per transport next to this machine's memcpy, side by side.

For each state (the tiny and small models, a synthetic 200 MB state) one learner (this
process) pushes to one rollout-worker actor on a local Ray cluster, through every
cross-process transport. Two figures per transport:

    move   latency from the learner's new version to the worker's report, neither end
           fingerprinting (the data path alone);
    sync   latency from the learner's new version to both ends' fingerprints being in, as
           every verified sync does (XXH3-128, engine/weightsync/fingerprint.py; its own
           GB/s is printed): the worker copies and hashes what it serves in one pass, on
           two threads (load_fingerprinted, as TorchRollout does), the learner hashes
           what it sent meanwhile (WeightSyncSession);
    2pass  the same, the worker hashing what it serves after loading it, a second pass
           over its bytes (as TorchRollout did before): "2pass/move" next to "sync/move"
           is what the one pass buys, measured in the same rounds;
    serial the same, the learner hashing before it sends (as the engine did before its
           hash moved behind the transfer): "overlap" = serial / sync;
    sha    the same with the SHA-256 fingerprint the engine used before (the reference
           copy below), timed in the same rounds on the same tensors.

"after" is "sync" with the learner's hash queued once the worker has loaded
(WeightSyncSession.send's hash_after_load, how the loop sends when generation waits for
the sync): its pass then shares no memory bandwidth with the worker's load, and the loop
gathers the step's metrics meanwhile; its table gives the time until the worker serves the
weights (SyncResult.latency_s, what the next generation waits for) beside move's, and the
time until both fingerprints are in.

"fp share" is the fingerprints' share of a whole sync, (sync - move) / sync: what verifying
every sync (weight_sync.verify_every = 1) adds to its latency; "sync/move" is the same as
a ratio, a verified sync's latency over an unverified one's (issue 36's goal: <= 1.1).
"every 4" is the same share measured over runs of 4 consecutive syncs at
weight_sync.verify_every = 4 (one verified): (mean of the 4 - move) / mean.

"shm adopted" first moves the learner's tensors into the shared buffer (ShmSender.adopt),
so only the worker copies; "broadcast 1buf" packs and sends with one buffer, so its
difference to "broadcast" is what double buffering buys. memcpy is a torch ``copy_`` of the
same tensors in this process, with as many torch threads as the learner's copies get
(--threads, default 1: a Ray worker's default; on a shared 2-core box a 2-thread copy waits
for its slower thread and swings 10x between rounds); "memcpy + xxh3 in one pass" is the
worker's verified load alone (load_fingerprinted), next to memcpy then a second pass.
Rounds alternate over memcpy, the fingerprint and every transport, so machine noise hits
all of them; medians and their ratio to memcpy are the figures to quote.

    .venv/bin/python bench/weight_sync.py [--states tiny small synthetic] [--rounds 5]
    .venv/bin/python bench/weight_sync.py --states small --transports shm "shm adopted"
    .venv/bin/python bench/weight_sync.py --quick       # tiny + 8 MB synthetic, 2 rounds
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time

import ray
import torch
from safetensors.torch import load_file

from engine.config import validate_config
from engine.orchestration.actors import LocalActor, RayActor
from engine.rollout.base import WeightReport
from engine.tinymodel import ensure_base_model
from engine.weightsync import build_receiver
from engine.weightsync.fingerprint import fingerprint, load_fingerprinted
from engine.weightsync.session import (
    EngineHost,
    Served,
    TensorSource,
    WeightSyncSession,
)

TRANSPORTS = {"shm": {"type": "shm"}, "shm adopted": {"type": "shm"},
              "object_store": {"type": "object_store"}, "broadcast": {"type": "broadcast"},
              "broadcast 1buf": {"type": "broadcast", "double_buffer": False},
              "checkpoint": {"type": "checkpoint"}}


def sha256_fingerprint(named_tensors) -> str:
    """The engine's fingerprint before XXH3 (same fields, same order), for comparison."""
    h = hashlib.sha256()
    for name, t in sorted(named_tensors, key=lambda kv: kv[0]):
        t = t.detach()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.contiguous().cpu().reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()[:16]


FINGERPRINTS = {"move": None, "serial": fingerprint, "sync": fingerprint,
                "after": fingerprint, "2pass": fingerprint, "sha": sha256_fingerprint}


class ServedWeights:
    """The receiving engine's part of a sync: TorchRollout.load_weights's one pass
    (load_fingerprinted) for "move", "serial", "sync" and "after"; for "2pass" and "sha" a
    copy into the tensors it serves, then their fingerprint."""

    def __init__(self, named):
        self.tensors = {n: torch.zeros_like(t) for n, t in named}
        self.version, self.mode = -1, "sync"

    def load_weights(self, named, version, verify=True):
        self.version = version
        if self.mode not in ("2pass", "sha"):
            _, fp = load_fingerprinted(self.tensors, named, verify and self.mode != "move")
            return WeightReport(version, fp, 0)
        for n, t in named:
            self.tensors[n].copy_(t)
        return WeightReport(version, FINGERPRINTS[self.mode](self.tensors.items()), 0)

    def weight_version(self):
        return self.version


@ray.remote(num_cpus=0)
class Worker(EngineHost):
    """A rollout worker holding one receiver per transport, so rounds can alternate."""

    def __init__(self, named_shapes):
        super().__init__(ServedWeights([(n, torch.zeros(s)) for n, s in named_shapes]))
        self.receivers = {}

    def setup_weight_receiver(self, cfg, join_info, rank):
        self.receivers[cfg.type] = build_receiver(cfg, join_info, rank)

    def receive_weights(self, ticket, step):
        return Served(self.receivers[ticket.transport].receive(ticket, self.engine),
                      time.time())

    def fingerprinting(self, mode):
        self.engine.mode = mode


class Source(TensorSource):
    """The learner's end, fingerprinting with the round's function (none for "move");
    "serial" hashes ahead of the send, in sync_weights."""

    mode, early = "sync", ""

    def sync_weights(self):
        if self.mode == "serial":
            self.early = fingerprint(self.named)
        return super().sync_weights()

    def weights_fingerprint(self, named):
        if self.mode == "serial":
            return self.early
        fn = FINGERPRINTS[self.mode]
        return fn(named) if fn else ""


def state(name: str, synthetic_mb: int) -> list[tuple[str, torch.Tensor]]:
    if name == "synthetic":          # 4 MiB float32 tensors, like a mid-size model's layers
        n = max(1, synthetic_mb * 10**6 // 2**22)
        return [(f"w{i}", torch.randn(2**20)) for i in range(n)]
    return list(load_file(ensure_base_model(name, 0) / "model.safetensors").items())


def bench_state(name: str, named, rounds: int, transports: list[str]) -> None:
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    shapes = [(n, tuple(t.shape)) for n, t in named]
    hosts: list[tuple[set, object]] = []      # (transport types it receives, worker)
    sessions, sources, worker_of = {}, {}, {}
    for kind in transports:
        cfg = validate_config({"weight_sync": TRANSPORTS[kind]}).weight_sync
        free = [w for types, w in hosts if cfg.type not in types]
        if not free:                          # a second variant of a type: its own worker
            hosts.append((set(), Worker.remote(shapes)))
            free = [hosts[-1][1]]
        worker_of[kind] = free[0]
        next(types for types, w in hosts if w is free[0]).add(cfg.type)
        sources[kind] = Source(named)
        sessions[kind] = WeightSyncSession(LocalActor(sources[kind]),
                                           [RayActor(worker_of[kind])], cfg)
        sessions[kind].connect()
        if kind == "shm adopted":
            sources[kind].named = [(n, t.clone()) for n, t in named]
            sources[kind].sender.adopt(sources[kind].named)
    dst = [torch.empty_like(t) for _, t in named]
    served = {n: d for (n, _), d in zip(named, dst, strict=True)}
    times: dict[str, list[float]] = {k: [] for k in
                                     ["memcpy", "fingerprint", "sha256", "one pass",
                                      *(f"{k} {m}" for k in sessions
                                        for m in [*FINGERPRINTS, "every4"]),
                                      *(f"{k} {m} served" for k in sessions
                                        for m in FINGERPRINTS)]}
    version = 0

    def one_sync(kind, after=False):
        nonlocal version
        version += 1
        sources[kind].version = version
        sessions[kind].send(version, initial=version == 1, hash_after_load=after)
        if after:
            sessions[kind].await_served()
        [res] = sessions[kind].settle(wait=True)
        return res

    for r in range(rounds + 1):                  # round 0 warms up (page faults, buffers)
        t0 = time.perf_counter()
        for d, (_, t) in zip(dst, named, strict=True):
            d.copy_(t)
        t1 = time.perf_counter()
        fp = fingerprint(named)
        t2 = time.perf_counter()
        sha = sha256_fingerprint(named)
        t3 = time.perf_counter()
        assert load_fingerprinted(served, named)[1] == fp
        t4 = time.perf_counter()
        if r:
            times["memcpy"].append(t1 - t0)
            times["fingerprint"].append(t2 - t1)
            times["sha256"].append(t3 - t2)
            times["one pass"].append(t4 - t3)
        modes = list(FINGERPRINTS)
        modes = modes[r % len(modes):] + modes[:r % len(modes)]   # no mode always first
        for kind, session in sessions.items():
            for mode in modes:
                ray.get(worker_of[kind].fingerprinting.remote(mode))
                sources[kind].mode = mode
                res = one_sync(kind, after=mode == "after")
                assert res.matched and res.fingerprint_learner == {
                    "move": "", "serial": fp, "sync": fp, "after": fp, "2pass": fp,
                    "sha": sha}[mode], res
                if r:
                    times[f"{kind} {mode}"].append(res.verify_latency_s)
                    times[f"{kind} {mode} served"].append(res.latency_s)
            cfg = session.cfg                        # 4 syncs at verify_every = 4
            session.cfg = cfg.model_copy(update={"verify_every": 4})
            sources[kind].mode, run = "sync", []
            ray.get(worker_of[kind].fingerprinting.remote("sync"))
            for _ in range(4):
                res = one_sync(kind)
                assert res.matched, res
                run.append(res.verify_latency_s)
            session.cfg = cfg
            if r:
                times[f"{kind} every4"].append(statistics.mean(run))
    med = {k: statistics.median(v) for k, v in times.items()}
    memcpy = nbytes / 1e9 / med["memcpy"]
    print(f"{name}: {nbytes / 1e6:.1f} MB in {len(named)} tensors, 1 worker, "
          f"{rounds} rounds (medians), {torch.get_num_threads()} torch thread(s)")
    print(f"  {'memcpy (torch copy_)':28s} {memcpy:6.2f} GB/s")
    xxh, sha = med["fingerprint"], med["sha256"]
    print(f"  {'fingerprint (xxh3-128)':28s} {nbytes / 1e9 / xxh:6.2f} GB/s "
          f"{xxh * 1e3:8.2f} ms")
    print(f"  {'fingerprint (sha256, before)':28s} {nbytes / 1e9 / sha:6.2f} GB/s "
          f"{sha * 1e3:8.2f} ms   xxh3 is {sha / xxh:.1f}x faster")
    one = med["one pass"]
    print(f"  {'memcpy + xxh3 in one pass':28s} {nbytes / 1e9 / one:6.2f} GB/s "
          f"{one * 1e3:8.2f} ms   / memcpy {one / med['memcpy']:.2f}x (a second pass: "
          f"{(med['memcpy'] + xxh) / med['memcpy']:.2f}x)")
    print(f"  {'transport':14s} {'move GB/s':>10s} {'ratio':>6s} {'sync GB/s':>10s} "
          f"{'ratio':>6s} {'sync ms':>8s} {'fp share':>8s} {'sync/move':>9s} {'2pass/move':>10s} "
          f"{'serial ms':>9s} "
          f"{'overlap':>7s} "
          f"{'serial share':>12s} {'every 4':>7s} {'sha ms':>8s} {'sha share':>9s}")

    def share(kind, mode):
        return (med[f"{kind} {mode}"] - med[f"{kind} move"]) / med[f"{kind} {mode}"]

    for kind in sessions:
        move, sync = (nbytes / 1e9 / med[f"{kind} {m}"] for m in ("move", "sync"))
        print(f"  {kind:14s} {move:10.2f} {move / memcpy:6.2f} {sync:10.2f} "
              f"{sync / memcpy:6.2f} {med[f'{kind} sync'] * 1e3:8.1f} "
              f"{share(kind, 'sync'):8.2f} {med[f'{kind} sync'] / med[f'{kind} move']:8.2f}x "
              f"{med[f'{kind} 2pass'] / med[f'{kind} move']:9.2f}x "
              f"{med[f'{kind} serial'] * 1e3:9.1f} "
              f"{med[f'{kind} serial'] / med[f'{kind} sync']:6.2f}x "
              f"{share(kind, 'serial'):12.2f} {share(kind, 'every4'):7.2f} "
              f"{med[f'{kind} sha'] * 1e3:8.1f} "
              f"{share(kind, 'sha'):9.2f}")
    print("  ratio = transport GB/s / memcpy GB/s; sync ms and sha ms run until both ends' "
          "fingerprints are in")
    print(f"  {'transport':14s} {'move ms':>8s} {'after ms':>8s} {'after/move':>10s} "
          f"{'after, both fp ms':>17s}")
    for kind in sessions:
        move, after = med[f"{kind} move served"], med[f"{kind} after served"]
        print(f"  {kind:14s} {move * 1e3:8.1f} {after * 1e3:8.1f} {after / move:9.2f}x "
              f"{med[f'{kind} after'] * 1e3:17.1f}")
    print("  after = the learner hashes once the worker has loaded (hash_after_load, as the "
          "loop's non-overlapping policies send);\n  move ms and after ms run until the worker "
          "serves the weights, what the next generation waits for")
    for source in sources.values():
        source.close_sender()
    for _, worker in hosts:
        ray.kill(worker)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--states", nargs="+", default=["tiny", "small", "synthetic"],
                    choices=["tiny", "small", "synthetic"])
    ap.add_argument("--synthetic-mb", type=int, default=200)
    ap.add_argument("--transports", nargs="+", default=list(TRANSPORTS), choices=list(TRANSPORTS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the learner")
    ap.add_argument("--quick", action="store_true", help="tiny + 8 MB synthetic, 2 rounds")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.quick:
        args.states, args.synthetic_mb, args.rounds = ["tiny", "synthetic"], 8, 2
    torch.manual_seed(0)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=2 * 10**9)
    try:
        for name in args.states:
            bench_state(name, state(name, args.synthetic_mb), args.rounds, args.transports)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
