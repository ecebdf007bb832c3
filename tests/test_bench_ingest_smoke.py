"""bench/ingest.py still runs end to end (uvicorn, Redis, websockets), at minimal sizes."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_ingest_bench_runs_at_minimal_sizes_and_prints_its_figures():
    result = subprocess.run(
        [sys.executable, "bench/ingest.py", "--senders", "2", "--batch", "2",
         "--seconds", "1", "--clients", "2", "--events", "5", "--interval", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)

    assert result.returncode == 0, result.stderr
    assert re.search(r"ingest: [\d,]+ metric values/s .* all in the DB", result.stdout)
    assert re.search(r"2 clients, 10 deliveries: p50 [\d.]+ ms, p99 [\d.]+ ms", result.stdout)
