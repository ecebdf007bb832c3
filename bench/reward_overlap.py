"""Step time (rollout + reward) with the sandbox reward: scored after generation vs
streamed to a pool of Ray reward workers as each completion finishes.

Same workload for every mode: the code preset's policy (its warm start), the same prompts
and seed, the torch sampler, and the real sandbox (a fresh namespaced process per
program, so scoring costs real time). Modes:

    after     generate the batch, then score it in this process, one program at a time
    pool      generate the batch, then score it in the pool (parallel, no overlap)
    streamed  each completion goes to the pool from on_complete while the rest generate

Rounds alternate between the modes so machine noise hits all of them; medians and their
ratios are printed (after / streamed is the headline; pool / streamed isolates overlap).

    .venv/bin/python bench/reward_overlap.py [--workers 2] [--prompts 8] [--group 8]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import ray

from engine.config import load_config
from engine.learner.warmstart import ensure_warm_start
from engine.model import load_tokenizer
from engine.orchestration.producer import RolloutProducer
from engine.reward import build_reward
from engine.reward.service import RewardPool
from engine.rollout.base import SamplingParams
from engine.rollout.torch_backend import TorchRollout
from engine.seeds import step_seed
from engine.tasks import build_task
from engine.telemetry.recorder import SpanRecorder

PRESET = Path(__file__).parents[1] / "configs" / "code_sandbox.toml"


class _AfterGeneration:
    """Hides the pool's streaming so the producer scores the whole batch at the end."""

    def __init__(self, pool: RewardPool):
        self.pool = pool

    def verdicts(self, problems, texts, finished):
        return self.pool.verdicts(problems, texts, finished)

    def score(self, problems, texts, finished):
        return self.pool.score(problems, texts, finished)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warm-steps", type=int, default=None,
                    help="warm start steps (default: the preset's; 0 = random init)")
    ap.add_argument("--quick", action="store_true", help="toy sizes, for the smoke test")
    args = ap.parse_args()
    if args.quick:
        args.workers, args.prompts, args.group, args.rounds, args.warm_steps = 1, 2, 2, 1, 0

    cfg = load_config(PRESET)
    if args.warm_steps is not None:
        cfg = cfg.model_copy(update={"warm_start": cfg.warm_start.model_copy(
            update={"steps": args.warm_steps})})
    model_dir = ensure_warm_start(cfg, log=lambda m: None)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        run_modes(cfg, model_dir, args)
    finally:
        ray.shutdown()


def run_modes(cfg, model_dir, args) -> None:
    task, tok = build_task(cfg.task), load_tokenizer(model_dir)
    engine = TorchRollout.from_pretrained(model_dir)
    params = SamplingParams(temperature=cfg.rollout.temperature,
                            max_new_tokens=cfg.rollout.max_new_tokens)
    inline = build_reward(cfg.reward.model_copy(update={"workers": 0}), task)
    pool = build_reward(cfg.reward.model_copy(update={"workers": args.workers}), task)
    rewards = {"after": inline, "pool": _AfterGeneration(pool), "streamed": pool}
    producers = {name: RolloutProducer(engine, r, tok, params, args.group,
                                       SpanRecorder(["cpu:0"]))
                 for name, r in rewards.items()}

    def produce(producer: RolloutProducer, rnd: int) -> None:
        producer.produce(rnd, task.train_problems(rnd, args.prompts),
                         seed=step_seed(cfg.model.seed, rnd))

    produce(producers["streamed"], 0)                      # warm up the pool's actors
    times: dict[str, list[float]] = {name: [] for name in producers}
    for rnd in range(args.rounds):
        for name, producer in producers.items():
            t0 = time.perf_counter()
            produce(producer, rnd)
            times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    n = args.prompts * args.group
    print(f"{n} completions per step, {args.workers} reward workers, {args.rounds} rounds; "
          f"step = rollout + reward (median s)")
    for name, ts in times.items():
        print(f"  {name:9s} {med[name]:7.3f} s   rounds: {', '.join(f'{t:.3f}' for t in ts)}")
    print(f"ratio after / streamed = {med['after'] / med['streamed']:.2f}")
    print(f"ratio pool / streamed = {med['pool'] / med['streamed']:.2f}")
    pool.close()


if __name__ == "__main__":
    main()
