"""bench/ingest.py still runs end to end (uvicorn, a Celery worker, Redis, sender
processes, websockets with a slow client among them), at minimal sizes, on SQLite; and
bench/alert_evaluation.py beside it."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_ingest_bench_runs_at_minimal_sizes_and_prints_its_figures():
    result = subprocess.run(
        [sys.executable, "bench/ingest.py", "--runs", "2", "--batch", "10", "--seconds", "1",
         "--replay-every", "2", "--workers", "1", "--fanout", "--watchers", "2",
         "--spread", "1", "--slow", "1", "--interval", "0.05"],
        cwd=ROOT, capture_output=True, text=True, timeout=180)

    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert re.search(r"ingest \(sqlite, 2 sender processes, 1 uvicorn workers\): [\d,]+ metric "
                     r"values/s", out)
    assert re.search(r"CPU per POST by role \(ms\): server [\d.]+, alerts [\d.]+, "
                     r"senders [\d.]+; [\d.]+ of the machine's \d+ cores", out)
    assert re.search(r"counted: 0 events lost, 0 doubled, 0 unexpected, 0 metric points "
                     r"missing; [1-9]\d* replayed batches, 0 not answered", out)
    assert re.search(r"fan-out, one run \(2 clients, 1 slow beside them\): [1-9][\d,]* "
                     r"deliveries, commit -> client p50 [\d.]+ ms, p99 [\d.]+ ms, max [\d.]+ ms; "
                     r"[\d,]+ more refilled .*, 0 of [\d,]+ missed", out)
    assert re.search(r"fan-out, 10 runs \(10 clients\): .* 0 of [\d,]+ missed", out)
    assert len(re.findall(r"server side, commit -> handed to the socket: p50 [\d.]+ ms, "
                          r"p99 [\d.]+ ms \([1-9][\d,]* sends\)", out)) == 2


@pytest.mark.slow
def test_the_alert_evaluation_bench_runs_at_minimal_sizes_and_prints_its_figures():
    result = subprocess.run(
        [sys.executable, "bench/alert_evaluation.py", "--steps", "20", "--batch", "10",
         "--rounds", "2"], cwd=ROOT, capture_output=True, text=True, timeout=120)

    assert result.returncode == 0, result.stderr
    assert re.search(r"alert evaluation after a batch \(sqlite, a run of 2\d steps, .*: history "
                     r"read whole [\d.]+ ms, read incrementally [\d.]+ ms \([\d.]+x\)",
                     result.stdout)
