"""Generated tokens/s: the torch rollout backend vs HF ``generate``, side by side.

Same model (the tiny preset unless --size), same prompts, same batch, same number of new
tokens per sequence (EOS ignored on both sides), both sampling at temperature 1. Rounds
alternate between the two engines so machine noise hits both; the ratio of medians is
the figure to quote.

    .venv/bin/python bench/rollout_throughput.py [--size tiny] [--batch 64] [--new 32]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from engine.config import ArithmeticTaskConfig
from engine.model import load_policy, load_tokenizer
from engine.rollout.base import SamplingParams
from engine.rollout.torch_backend import TorchRollout
from engine.tasks import ArithmeticTask
from engine.tinymodel import ensure_base_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="tiny", choices=["tiny", "small"])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new", type=int, default=32, help="new tokens per sequence")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()

    path = ensure_base_model(args.size, 0)
    tok = load_tokenizer(path)
    hf = load_policy(path).eval()
    ours = TorchRollout.from_pretrained(path)
    problems = ArithmeticTask(ArithmeticTaskConfig()).train_problems(0, args.batch)
    prompts = [tok(p.prompt)["input_ids"] for p in problems]
    enc = tok([p.prompt for p in problems], return_tensors="pt", padding=True)
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new, ignore_eos=True)

    def run_ours() -> int:
        outs = ours.generate(prompts, params, seed=0)
        return sum(len(o.token_ids) for o in outs)

    @torch.no_grad()
    def run_hf() -> int:
        out = hf.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                          max_new_tokens=args.new, min_new_tokens=args.new,
                          pad_token_id=tok.pad_token_id, eos_token_id=None)
        return (out.shape[1] - enc["input_ids"].shape[1]) * out.shape[0]

    run_ours(), run_hf()                                            # warm up both
    rates: dict[str, list[float]] = {"torch": [], "hf_generate": []}
    for _ in range(args.rounds):
        for name, fn in (("torch", run_ours), ("hf_generate", run_hf)):
            t0 = time.perf_counter()
            n = fn()
            rates[name].append(n / (time.perf_counter() - t0))
    med = {k: statistics.median(v) for k, v in rates.items()}
    print(f"model={args.size} batch={args.batch} new_tokens={args.new} "
          f"rounds={args.rounds} threads={torch.get_num_threads()}")
    for k, v in med.items():
        print(f"  {k:12s} {v:10.0f} tokens/s   (rounds: {', '.join(f'{x:.0f}' for x in rates[k])})")
    print(f"  ratio torch / hf_generate = {med['torch'] / med['hf_generate']:.2f}")


if __name__ == "__main__":
    main()
