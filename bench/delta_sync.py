"""Delta weight sync over a real run: density and bytes on the wire, fp32 and bf16.

Runs the demo recipe (configs/demo_arithmetic.toml: GRPO on two-digit addition, the tiny
model) for a few steps on a local Ray cluster, learner and one rollout worker as actors,
with weight_sync = {type = "shm", delta = true}, once with model.dtype = "float32" and once
with "bfloat16" (the learner's parameters and what travels are then bf16). Every figure is
read back from the run's own events (weight_sync.report, metrics.append):

    density      elements whose bytes changed since the version before, over all
                 elements (weight_sync/delta_density), median over the delta syncs
    wire         bytes each worker received: the zstd-compressed XOR (full syncs: all)
    wire/full    wire bytes over the weights' bytes, per delta sync (median)
    run total    all bytes on the wire over the run / what full syncs would have sent
    eff GB/s     weights' bytes per second of resync latency (learner's new version ->
                 worker serving it), median over the delta syncs

Every sync is verified (weight_sync.verify_every = 1): the rollout worker's fingerprint of
what it serves equals the learner's, or the bench fails.

    .venv/bin/python bench/delta_sync.py [--steps 8] [--dtypes float32 bfloat16]
                                         [--lr 1e-4] [--warm-start-steps 300]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import tomllib
from pathlib import Path

import ray

from engine.api import run_local
from engine.config import validate_config

ROOT = Path(__file__).parents[1]


def run(dtype: str, steps: int, out: Path, lr: float | None,
        warm_start_steps: int | None) -> list[dict]:
    data = tomllib.loads((ROOT / "configs" / "demo_arithmetic.toml").read_text())
    data["model"]["dtype"] = dtype
    data["placement"] = {"type": "disaggregated"}
    data["weight_sync"] = {"type": "shm", "delta": True}
    data["telemetry"] = {"eval_every_steps": 0}
    data["checkpoint"] = {"every_steps": 0}
    if lr is not None:
        data["algorithm"]["lr"] = lr
    if warm_start_steps is not None:
        data["warm_start"]["steps"] = warm_start_steps
    data["steps"] = steps
    summary = run_local(validate_config(data), out, steps=steps)
    assert summary.status == "succeeded", summary
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    syncs = [e for e in events if e["type"] == "weight_sync.report"]
    density = {e["step"]: e["values"]["weight_sync/delta_density"] for e in events
               if e["type"] == "metrics.append" and "weight_sync/delta_density" in e["values"]}
    assert syncs and all(s["matched"] and s["verified"] for s in syncs), syncs
    for s in syncs:
        s["density"] = density.get(s["step"])
    return syncs


def report(dtype: str, syncs: list[dict], cfg_note: str) -> None:
    deltas = [s for s in syncs if s["wire_bytes"] < s["bytes"]]
    full = sum(s["bytes"] for s in syncs)
    wire = sum(s["wire_bytes"] for s in syncs)
    print(f"{dtype}: {len(syncs)} syncs ({len(deltas)} delta), "
          f"{syncs[0]['bytes'] / 1e6:.2f} MB of weights; {cfg_note}")
    if not deltas:
        print("  no delta sync (every XOR compressed to more than the weights)")
        return
    dens = [s["density"] for s in deltas if s["density"] is not None]
    ratio = statistics.median(s["wire_bytes"] / s["bytes"] for s in deltas)
    eff = statistics.median(s["bytes"] / 1e9 / max(s["latency_s"], 1e-9) for s in deltas)
    print(f"  density (changed elements)  {statistics.median(dens):8.4f}  "
          f"(min {min(dens):.4f}, max {max(dens):.4f})")
    per_sync = statistics.median(s["wire_bytes"] for s in deltas)
    print(f"  wire per delta sync         {per_sync / 1e6:8.3f} MB")
    print(f"  wire/full per delta sync    {ratio:8.4f}")
    print(f"  run total wire/full         {wire / full:8.4f}  "
          f"({wire / 1e6:.2f} of {full / 1e6:.2f} MB)")
    print(f"  eff GB/s (delta syncs)      {eff:8.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"],
                    choices=["float32", "bfloat16"])
    ap.add_argument("--lr", type=float, default=None, help="override algorithm.lr")
    ap.add_argument("--warm-start-steps", type=int, default=None,
                    help="override warm_start.steps (the demo's 300 take minutes on a "
                         "loaded machine, and Adam's step size, not the start, sets density)")
    args = ap.parse_args()
    ray.init(address="local", num_cpus=2, num_gpus=2, include_dashboard=False,
             log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for dtype in args.dtypes:
                note = (f"lr {args.lr or 'demo'}, warm start "
                        f"{args.warm_start_steps if args.warm_start_steps is not None else 'demo'}"
                        f" steps")
                report(dtype, run(dtype, args.steps, Path(tmp) / dtype, args.lr,
                                  args.warm_start_steps), note)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
