"""The benchmark scripts keep working (they are run by hand; here at toy sizes)."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def test_rollout_throughput_bench_prints_both_rates_and_their_ratio(model_cache):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "rollout_throughput.py"), "--batch", "4",
         "--new", "4", "--rounds", "1"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "tokens/s" in proc.stdout
    assert "ratio torch / hf_generate" in proc.stdout


def test_reward_overlap_bench_prints_the_after_vs_streamed_ratio(model_cache):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "reward_overlap.py"), "--quick"],
        capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "ratio after / streamed" in proc.stdout
    assert "ratio pool / streamed" in proc.stdout


def test_sandbox_overhead_bench_prints_one_by_one_and_at_once_ratios():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "sandbox_overhead.py"),
                           "--rounds", "1", "--at-once", "2"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "per program: sandbox" in proc.stdout and "2 at once, per program" in proc.stdout


@pytest.mark.slow
def test_weight_sync_bench_prints_every_transport_next_to_memcpy(model_cache):
    # the tiny state, one round: what --quick prints but its 8 MB synthetic state, 6 s less
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "weight_sync.py"),
                           "--states", "tiny", "--rounds", "1"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "memcpy (torch copy_)" in proc.stdout
    for transport in ("shm", "shm adopted", "object_store", "broadcast", "broadcast 1buf",
                      "checkpoint"):
        assert f"\n  {transport} " in proc.stdout
    assert "ratio = transport GB/s / memcpy GB/s" in proc.stdout
    assert "fingerprint (xxh3-128)" in proc.stdout and "fingerprint (sha256, before)" in proc.stdout
    assert "fp share" in proc.stdout and "sha share" in proc.stdout
    assert "serial share" in proc.stdout and "every 4" in proc.stdout
    assert "after/move" in proc.stdout


@pytest.mark.slow
def test_async_policies_bench_prints_rates_bubbles_and_ratios_to_sync(model_cache):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "async_policies.py"), "--quick",
                           "--policies", "sync", "fully_async"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    for policy in ("sync", "fully_async"):
        assert f"\n  {policy} " in proc.stdout
    assert "samples/s  bubble" in proc.stdout and "ratio to sync" in proc.stdout


@pytest.mark.slow
def test_vs_trl_bench_prints_both_sides_and_their_ratio(model_cache):
    # ~18 s on a quiet 2-core box (each side set up once, then 2 steps)
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "vs_trl.py"), "--quick"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "\n  trl " in proc.stdout and "\n  rlplane " in proc.stdout
    assert "s/step" in proc.stdout and "ratio trl / rlplane" in proc.stdout
    # one-step-off on a thread, at idle priority and on cores of its own
    assert "ratio trl / rlplane overlapped (idle)" in proc.stdout
    assert "ratio trl / rlplane overlapped (split)" in proc.stdout


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_sync_bench_prints_its_table_and_the_fingerprints_share(model_cache):
    # The reference path alone (each path is a vLLM engine of its own, ~25 s here); the
    # other paths' own code is the transports': vllm_native through vLLM's transfer API in
    # a run on Ray (test_async_ray) and across a prefix cache (test_transports_vllm).
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "vllm_sync.py"), "--sizes",
                           "tiny", "--rounds", "1", "--paths", "broadcast"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "\n  broadcast " in proc.stdout and "1.00x broadcast" in proc.stdout
    assert "(broadcast worker)" in proc.stdout and "of a sync" in proc.stdout


@pytest.mark.slow
def test_planner_accuracy_bench_prints_predicted_next_to_measured(model_cache, tmp_path):
    # Two runs (the sync run it fits on, and the policy the planner models in the most
    # detail), not the four of the full table: each is a Ray run of ~25 s here.
    saved, policies = tmp_path / "runs.json", ["sync", "partial_rollout"]
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "planner_accuracy.py"), "--quick",
                           "--recipes", "demo_arithmetic", "--policies", *policies,
                           "--save", str(saved)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    for policy in policies:
        assert f"demo_arithmetic    {policy}" in proc.stdout
    assert "one_step_off" not in proc.stdout
    assert "pred sps  meas sps  ratio" in proc.stdout and "s CPU" in proc.stdout
    again = subprocess.run([sys.executable, str(ROOT / "bench" / "planner_accuracy.py"),
                            "--recipes", "demo_arithmetic", "--policies", *policies,
                            "--replay", str(saved)],
                           capture_output=True, text=True, cwd=ROOT)
    assert again.returncode == 0, again.stderr
    table = proc.stdout[proc.stdout.index("planner accuracy"):]
    assert table == again.stdout[again.stdout.index("planner accuracy"):]
