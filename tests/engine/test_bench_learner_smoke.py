"""bench/learner_throughput.py keeps working (it is run by hand; here at toy size)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.mark.slow
def test_learner_throughput_bench_prints_padded_packed_and_the_fraction_of_peak(model_cache):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "learner_throughput.py"), "--quick"],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    for layout in ("padded", "packed"):
        assert f"  tiny   {layout} " in proc.stdout
    assert "ratio packed / padded = " in proc.stdout and "of peak" in proc.stdout
