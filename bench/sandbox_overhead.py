"""What containment costs per program: one correct program run in the sandbox vs the same
harness run by a bare ``python -I -S`` (no namespaces, no cgroup, no seccomp, no limits'
enforcement beyond the harness's own rlimits).

Rounds alternate between the two so machine noise hits both; medians and their ratio are
printed (the ratio is the figure: sandbox time / bare interpreter time). Then the same with
``--at-once`` programs started together (a multi-turn batch's turn: each trajectory's
program at the same moment): wall time per program, which the CPU bounds there.

    .venv/bin/python bench/sandbox_overhead.py [--rounds 30] [--at-once 32]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from engine.reward.sandbox import HARNESS, PYTHON, Limits, isolation, job_bytes, run_tests

CODE, TESTS = "f=lambda x:x+3", [(0, 3), (2, 5), (-4, -1)]


def sandboxed() -> float:
    t0 = time.perf_counter()
    assert run_tests(CODE, TESTS).reason == "pass"
    return time.perf_counter() - t0


def bare() -> float:
    job = job_bytes(CODE, [x for x, _ in TESTS], Limits(max_processes=4096))
    t0 = time.perf_counter()
    out = subprocess.run([PYTHON, "-I", "-S", "-c", HARNESS], input=job, capture_output=True,
                         check=True)
    assert json.loads(out.stdout)["outputs"] == [y for _, y in TESTS]
    return time.perf_counter() - t0


def at_once(run, n: int) -> float:
    """Seconds per program with ``n`` started together."""
    with ThreadPoolExecutor(n) as pool:
        t0 = time.perf_counter()
        list(pool.map(lambda _: run(), range(n)))
        return (time.perf_counter() - t0) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--at-once", type=int, default=32)
    args = ap.parse_args()
    rounds = args.rounds
    print("isolation:", isolation())
    sandboxed(), bare()                                   # warm: the probe, page cache
    times: dict[str, list[float]] = {"sandbox": [], "bare": []}
    for _ in range(rounds):
        times["sandbox"].append(sandboxed())
        times["bare"].append(bare())
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"per program: sandbox {med['sandbox'] * 1e3:.0f} ms, bare interpreter "
          f"{med['bare'] * 1e3:.0f} ms, ratio {med['sandbox'] / med['bare']:.2f} "
          f"({rounds} alternating rounds, medians)")
    n, batches = args.at_once, max(1, rounds // 10)
    times = {"sandbox": [], "bare": []}
    for _ in range(batches):
        times["sandbox"].append(at_once(sandboxed, n))
        times["bare"].append(at_once(bare, n))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{n} at once, per program: sandbox {med['sandbox'] * 1e3:.1f} ms, bare interpreter "
          f"{med['bare'] * 1e3:.1f} ms, ratio {med['sandbox'] / med['bare']:.2f} "
          f"({batches} alternating batches, medians)")


if __name__ == "__main__":
    main()
