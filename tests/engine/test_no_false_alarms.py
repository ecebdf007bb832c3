"""No false alarms: every preset in configs/, run healthy, raises no alert at all.

Each preset runs its own loop (model, task, algorithm, rollout backend, batch sizes) for
its test length with the default thresholds; only the warm start is the shared short one,
to keep the suite's time modest on 2 cores. The rules are evaluated as ingest does (at
every step) and as the periodic task would at its worst moment (just before each event).
"""

from pathlib import Path

import pytest

from engine.api import run_local
from engine.config import load_config, validate_config
from jobs.alerts.history import RunFacts

from .alert_watch import AlertWatch

CONFIGS = sorted((Path(__file__).parents[2] / "configs").glob("*.toml"))
TEST_STEPS = 4


def healthy_run(path: Path, tmp_path) -> AlertWatch:
    data = load_config(path).model_dump(mode="json", exclude_none=True)
    data.update(steps=TEST_STEPS, max_seconds=None,
                warm_start={"steps": 60, "batch_size": 32})
    data["task"]["eval_size"] = 16
    data["telemetry"].update(eval_every_steps=0, eval_samples=1)
    cfg = validate_config(data)
    watch = AlertWatch(RunFacts.from_config(cfg, "running"))
    run_local(cfg, tmp_path, sink=watch)
    return watch


@pytest.mark.slow
@pytest.mark.parametrize("path", [
    pytest.param(p, marks=[pytest.mark.vllm] if "vllm" in p.name else [], id=p.name)
    for p in CONFIGS])
def test_a_healthy_preset_raises_no_alert(path, tmp_path, capsys):
    watch = healthy_run(path, tmp_path)
    assert watch.steps_checked == TEST_STEPS
    assert watch.fired == [], [f"step {s}: {f.kind}: {f.cause}" for s, f in watch.fired]
    with capsys.disabled():
        print(f"\n{path.name}: {watch.steps_checked} healthy steps checked, no alert")
