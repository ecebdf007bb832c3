"""Learner tokens/s, padded vs packed, and its FLOP/s against this machine's matmul peak.

One RL step's batch of each recipe (the demo's and the long-tail reverse task's by
default): its prompts x group_size, and as responses the task's correct answers + EOS,
which is what the warm-started policies answer (the demo's warm-started sampler gave
response lengths mean 3.7, max 4 on 128 samples; --sampled draws them from the recipe's
warm-started policy instead, building its warm start if it is not cached). The same batch
is trained on by the tiny and the small preset (same tokenizer), one full
``Learner.update`` per round (recompute + optimizer steps), padded and packed rounds
alternating so machine noise hits both; medians are quoted.

    tokens/s  = real (prompt + response) tokens of the batch / update seconds, by wall
                clock and, on CPU, by CPU time (Clock says why)
    FLOP/s    = 6 x params x tokens per optimizer step / update seconds, summed over the
                update's optimizer steps; params exclude the input embedding (a lookup).
                The recompute forward the update also runs (2 x params x tokens) is not
                counted, so this is the training-step convention: what the update
                achieves. The packed layout computes a group's prompt once for all its
                responses (engine.learner.batch.shared_layout), so it does less work
                than this counts, and its figure can pass the peak.
    run FLOP/s = the matmul FLOPs the update actually ran (torch.utils.flop_counter over
                one untimed update: linear layers, attention, the recompute, pad slots)
                / update seconds: how busy the matmul units were, the utilization.
    peak      = torch.matmul of two square matrices (1024 on CPU, 8192 on CUDA) in the
                learner's precision, the best of a burst measured
                before every round (same threads), median over rounds: on a shared
                machine a peak taken once would be taken under someone else's load

    .venv/bin/python bench/learner_throughput.py [--recipes demo_arithmetic longtail_reverse]
        [--sizes tiny small] [--rounds 3] [--device cpu|cuda] [--precision fp32|bf16]
        [--sampled] [--compile] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from engine.config import LearnerConfig, RunConfig, load_config
from engine.experience import Sample
from engine.learner.batch import pack, packed_layout, padded_layout, shared_layout
from engine.learner.learner import Learner
from engine.learner.warmstart import ensure_warm_start
from engine.model import encode_prompt, load_policy, load_tokenizer
from engine.rollout.base import SamplingParams
from engine.rollout.torch_backend import TorchRollout
from engine.tasks import build_task
from engine.tinymodel import ensure_base_model

ROOT = Path(__file__).parents[1]


def recipe_batch(cfg: RunConfig, sampled: bool) -> list[Sample]:
    """One step's samples: the recipe's prompts x group_size, answered (module doc)."""
    base = ensure_base_model(cfg.model.size, cfg.model.seed)
    tok = load_tokenizer(base)
    group = cfg.algorithm.group_size
    problems = [p for p in build_task(cfg.task).train_problems(0, cfg.rollout.prompts_per_step)
                for _ in range(group)]
    prompts = [encode_prompt(tok, p.prompt) for p in problems]
    if sampled:
        r = cfg.rollout
        outs = TorchRollout.from_pretrained(ensure_warm_start(cfg)).generate(
            prompts, SamplingParams(temperature=r.temperature, top_p=r.top_p,
                                    max_new_tokens=r.max_new_tokens), seed=0)
        responses = [o.token_ids for o in outs]
    else:
        responses = [tok(p.answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
                     for p in problems]
    return [Sample(p, ids, resp, [0.0] * len(resp), True, 0, i // group,
                   advantage=1.0 if i % 2 else -1.0)
            for i, (p, ids, resp) in enumerate(zip(problems, prompts, responses, strict=True))]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class Clock:
    """Seconds of a call: wall time, or on CPU also the process's CPU time over its
    threads, the wall time it would have taken with its threads to itself. On a shared
    machine (this project's CI box: 2 cores, several engineers) wall time mostly measures
    the neighbours; CPU time measures the work (spinning OpenMP threads count as work)."""

    def __init__(self, device: str):
        self.device, self.threads = device, torch.get_num_threads()

    def time(self, fn) -> tuple[float, float]:
        sync(self.device)
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        sync(self.device)
        wall = time.perf_counter() - w0
        cpu = (time.process_time() - c0) / self.threads if self.device == "cpu" else wall
        return wall, cpu


def matmul_peak(n: int, clock: Clock, dtype: torch.dtype, seconds: float = 0.3):
    """Best FLOP/s of (n, n) @ (n, n) in ``dtype`` over a burst: (by wall, by CPU time)."""
    a = torch.randn(n, n, device=clock.device, dtype=dtype)
    b = torch.randn(n, n, device=clock.device, dtype=dtype)
    a @ b
    best, end = [0.0, 0.0], time.perf_counter() + seconds
    while time.perf_counter() < end:
        for k, t in enumerate(clock.time(lambda: a @ b)):
            best[k] = max(best[k], 2 * n**3 / max(t, 1e-9))
    return best


def bench_recipe(recipe: Path, args) -> None:
    cfg = load_config(recipe)
    batch = pack(recipe_batch(cfg, args.sampled), load_tokenizer(
        ensure_base_model("tiny", 0)).pad_token_id)
    real = sum(batch.row_tokens())
    resp = batch.response_mask.sum(-1)
    print(f"\nrecipe {recipe.stem}: {len(batch)} samples, response tokens mean "
          f"{float(resp.mean()):.1f} max {int(resp.max())}; real tokens {real}, the padded "
          f"layout computes {padded_layout(batch).tokens}, packed "
          f"{packed_layout(batch).tokens}, packed with shared prompts "
          f"{shared_layout(batch).tokens} (one minibatch)")
    alg = cfg.algorithm
    print(f"  {'model':6s} {'layout':7s} {'clock':5s} {'tokens/s':>10s} {'GFLOP/s':>9s} "
          f"{'of peak':>8s} {'run GFLOP/s':>12s} {'of peak':>8s}")
    clock = Clock(args.device)
    clocks = ("wall", "cpu") if args.device == "cpu" else ("wall",)
    for size in args.sizes:
        model_dir = ensure_base_model(size, cfg.model.seed)
        learners = {}
        for layout in ("padded", "packed") + (("compiled",) if args.compile else ()):
            setup = LearnerConfig(device=args.device, precision=args.precision,
                                  packing=layout != "padded", compile=layout == "compiled")
            learners[layout] = Learner(load_policy(model_dir), alg, cfg.rollout.temperature,
                                       seed=0, setup=setup, top_p=cfg.rollout.top_p)
        policy = learners["padded"].policy
        n_params = sum(p.numel() for p in policy.parameters()) \
            - policy.get_input_embeddings().weight.numel()
        flops = 6 * n_params * real * alg.epochs      # every token, once per epoch
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in learners}
        peaks = []
        ran = {}
        for name, learner in learners.items():
            learner.update(batch)                        # warm up (and compile)
            with FlopCounterMode(display=False) as counter:
                learner.update(batch)
            ran[name] = counter.get_total_flops()
        for _ in range(args.rounds):
            peaks.append(matmul_peak(args.peak_n, clock, args.dtype))
            for name, learner in learners.items():
                times[name].append(clock.time(lambda learner=learner: learner.update(batch)))
        for k, c in enumerate(clocks):
            peak = statistics.median(p[k] for p in peaks)
            med = {n: statistics.median(t[k] for t in v) for n, v in times.items()}
            for name, sec in med.items():
                print(f"  {size:6s} {name:7s} {c:5s} {real / sec:10.0f} "
                      f"{flops / sec / 1e9:9.1f} {flops / sec / peak:8.1%} "
                      f"{ran[name] / sec / 1e9:12.1f} {ran[name] / sec / peak:8.1%}")
            print(f"  {size:6s} ratio packed / padded = {med['padded'] / med['packed']:.2f} "
                  f"by {c} time; {args.precision} matmul peak {peak / 1e9:.1f} GFLOP/s")
            if "compiled" in med:
                print(f"  {size:6s} ratio compiled / packed = "
                      f"{med['packed'] / med['compiled']:.2f} by {c} time")
        print(f"  {size:6s} params {n_params / 1e6:.1f}M, medians of {args.rounds} rounds")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recipes", nargs="+", default=["demo_arithmetic", "longtail_reverse"],
                    help="names of configs/*.toml")
    ap.add_argument("--sizes", nargs="+", default=["tiny", "small"], choices=["tiny", "small"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sampled", action="store_true",
                    help="responses sampled by the recipe's warm-started policy")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                    help="the learner's, and the peak matmul's dtype")
    ap.add_argument("--compile", action="store_true",
                    help="also the packed layout with learner.compile (torch.compile of "
                         "each decoder layer; its compile is in the untimed warm-up)")
    ap.add_argument("--quick", action="store_true", help="tiny, demo, 1 round: a smoke run")
    args = ap.parse_args()
    args.dtype = torch.float32 if args.precision == "fp32" else torch.bfloat16
    args.peak_n = 1024 if args.device == "cpu" else 8192
    if args.quick:
        args.sizes, args.rounds, args.recipes, args.peak_n = ["tiny"], 1, ["demo_arithmetic"], 256
    print(f"torch {torch.__version__}, {args.device}, {args.precision}, "
          f"{torch.get_num_threads()} threads; ratio = padded seconds / packed seconds")
    for name in args.recipes:
        bench_recipe(ROOT / "configs" / f"{name}.toml", args)


if __name__ == "__main__":
    main()
