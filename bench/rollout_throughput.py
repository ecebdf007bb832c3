"""Generated tokens/s: the torch rollout backend vs HF ``generate``, side by side.

Same model (the tiny preset unless --size), same prompts, same batch, same number of new
tokens per sequence (EOS ignored on both sides), both sampling at temperature 1. Rounds
alternate between the two engines so machine noise hits both, and each round's ratio is
taken between the two calls of that round: the median of those paired ratios is the
figure to quote (a ratio of the two medians breaks when the load shifts mid-run, as it
does on a shared box). Each call is timed by the wall clock and by the process's CPU time
over its torch threads (bench/learner_throughput.py's Clock: what the call would take
with its threads to itself, the figure that holds on a shared machine).

--group G makes the batch batch/G prompts x G completions each, as an RL step's groups
are (the demo recipe: 16 x 8): the torch backend prefills each prompt once and copies its
cache to its group; HF generate gets the same rows (``num_return_sequences = G``), which
it expands before its prefill.

    .venv/bin/python bench/rollout_throughput.py [--size tiny] [--batch 64] [--new 32]
        [--group 1] [--rounds 5] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

from engine.config import ArithmeticTaskConfig
from engine.model import load_policy, load_tokenizer
from engine.rollout.base import SamplingParams
from engine.rollout.torch_backend import TorchRollout
from engine.tasks import ArithmeticTask
from engine.tinymodel import ensure_base_model

sys.path.insert(0, str(Path(__file__).parent))
from learner_throughput import Clock  # noqa: E402  (one way to time a call, both benches)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="tiny", choices=["tiny", "small"])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--new", type=int, default=32, help="new tokens per sequence")
    ap.add_argument("--group", type=int, default=1,
                    help="completions per prompt (batch / group prompts)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    path = ensure_base_model(args.size, 0)
    tok = load_tokenizer(path)
    hf = load_policy(path).eval()
    ours = TorchRollout.from_pretrained(path)
    if args.batch % args.group:
        ap.error(f"--batch {args.batch} is not a multiple of --group {args.group}")
    problems = ArithmeticTask(ArithmeticTaskConfig()).train_problems(0, args.batch // args.group)
    prompts = [tok(p.prompt)["input_ids"] for p in problems for _ in range(args.group)]
    enc = tok([p.prompt for p in problems], return_tensors="pt", padding=True)
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new, ignore_eos=True)

    def run_ours() -> int:
        outs = ours.generate(prompts, params, seed=0)
        return sum(len(o.token_ids) for o in outs)

    @torch.no_grad()
    def run_hf() -> int:
        out = hf.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
                          max_new_tokens=args.new, min_new_tokens=args.new,
                          num_return_sequences=args.group,
                          pad_token_id=tok.pad_token_id, eos_token_id=None)
        return (out.shape[1] - enc["input_ids"].shape[1]) * out.shape[0]

    run_ours(), run_hf()                                            # warm up both
    clock = Clock("cpu")
    # rates[clock][engine]: tokens/s per round, by wall and by CPU time
    rates = {c: {"torch": [], "hf_generate": []} for c in ("wall", "cpu")}
    for _ in range(args.rounds):
        for name, fn in (("torch", run_ours), ("hf_generate", run_hf)):
            n = 0

            def call(fn=fn):
                nonlocal n
                n = fn()
            for c, seconds in zip(("wall", "cpu"), clock.time(call), strict=True):
                rates[c][name].append(n / seconds)
    print(f"model={args.size} batch={args.batch} group={args.group} new_tokens={args.new} "
          f"rounds={args.rounds} threads={torch.get_num_threads()}")
    for c, by_engine in rates.items():
        paired = [a / b for a, b in zip(by_engine["torch"], by_engine["hf_generate"],
                                        strict=True)]
        for k, v in by_engine.items():
            print(f"  {c:4s} {k:12s} {statistics.median(v):10.0f} tokens/s   "
                  f"(rounds: {', '.join(f'{x:.0f}' for x in v)})")
        print(f"  {c:4s} ratio torch / hf_generate = {statistics.median(paired):.2f} "
              f"(median of the rounds' paired ratios: "
              f"{', '.join(f'{x:.2f}' for x in paired)})")


if __name__ == "__main__":
    main()
