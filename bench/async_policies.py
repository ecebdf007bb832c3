"""Samples/s and bubble per async policy on the long-tail task, disaggregated on Ray.

One Ray instance (logical GPUs), one rollout worker + one learner, each an actor with
``--threads`` torch threads (1 each on a 2-core box: one core per actor, so overlapping
them does not slow either down). Every policy runs the same config
(configs/longtail_reverse.toml, warm start included, weights over shared memory); only
async_policy changes. Rounds alternate the policies so machine noise hits all of them;
the figures are medians over rounds, and the ratios are to sync's median.

    samples/s = samples trained / summed step wall time, first step left out (the
                pipeline fills there); bubble = mean of the steps' bubble (all devices)

    .venv/bin/python bench/async_policies.py [--steps 8] [--rounds 2] [--threads 1]
    .venv/bin/python bench/async_policies.py --quick     # smoke: toy sizes, 2 steps
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import ray

from engine.api import MetricsEvent, run_local
from engine.config import load_config, validate_config
from engine.telemetry.sinks import MemorySink

ROOT = Path(__file__).parents[1]
POLICIES = {
    "sync": {"type": "sync"},
    "one_step_off": {"type": "one_step_off"},
    "partial_rollout": {"type": "partial_rollout"},
    "fully_async": {"type": "fully_async"},
}


def config(policy: str, steps: int, threads: int, quick: bool):
    data = load_config(ROOT / "configs" / "longtail_reverse.toml").model_dump(mode="json")
    data.update(steps=steps, name=f"bench-{policy}")
    data["placement"] = {"type": "disaggregated", "threads_per_actor": threads}
    data["weight_sync"] = {"type": "shm"}
    data["async_policy"] = POLICIES[policy]
    data["telemetry"].update(eval_samples=1, jsonl=False)
    data["task"]["eval_size"] = 8
    if quick:
        data["warm_start"]["steps"] = 0
        data["task"].update(max_len=6)
        data["rollout"].update(prompts_per_step=4, max_new_tokens=7)
        data["algorithm"]["group_size"] = 2
    return validate_config(data)


def measure(policy: str, steps: int, threads: int, quick: bool) -> tuple[float, float]:
    sink = MemorySink()
    with tempfile.TemporaryDirectory() as out:
        run_local(config(policy, steps, threads, quick), out, sink=sink)
    rows = [e.values for e in sink.events
            if isinstance(e, MetricsEvent) and "bubble" in e.values][1:]
    samples = sum(m["throughput/samples_per_s"] * m["time/step_s"] for m in rows)
    wall = sum(m["time/step_s"] for m in rows)
    return samples / wall, statistics.fmean(m["bubble"] for m in rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per actor")
    ap.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    ap.add_argument("--quick", action="store_true", help="toy sizes: a smoke test")
    args = ap.parse_args()
    steps, rounds = (2, 1) if args.quick else (args.steps, args.rounds)
    rate: dict[str, list[float]] = {p: [] for p in args.policies}
    bubble: dict[str, list[float]] = {p: [] for p in args.policies}
    ray.init(address="local", num_cpus=2, num_gpus=2, include_dashboard=False,
             log_to_driver=False)
    try:
        for r in range(rounds):
            order = args.policies[r % len(args.policies):] + args.policies[:r % len(args.policies)]
            for policy in order:
                s, b = measure(policy, steps, args.threads, args.quick)
                rate[policy].append(s)
                bubble[policy].append(b)
                print(f"round {r}: {policy:15s} {s:7.1f} samples/s  bubble {b:.2f}", flush=True)
    finally:
        ray.shutdown()
    print(f"longtail_reverse, disaggregated (1 rollout worker + 1 learner), "
          f"{args.threads} torch thread(s) per actor, {steps} steps x {rounds} rounds")
    base = statistics.median(rate["sync"]) if "sync" in rate else None
    for p in args.policies:
        med = statistics.median(rate[p])
        ratio = f"  ratio to sync {med / base:.2f}" if base else ""
        print(f"  {p:15s} {med:7.1f} samples/s  bubble {statistics.median(bubble[p]):.2f}"
              f"{ratio}")


if __name__ == "__main__":
    main()
