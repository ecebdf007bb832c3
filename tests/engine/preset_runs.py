"""One run of a preset, read by every test that asks something of it.

A learning test and a no-false-alarm test of the same preset once ran the same loop twice
(the demo, PPO, GSM8K and sandbox presets: the first for its held-out gain, the second,
24 shorter steps later, for its silence). Here the run happens once per test process, on
the preset's own recipe, with the control plane's alert rules watching it (deferred: the
rules' cost stays out of the steps whose bubble they judge), and each test reads what it
needs: the summary's evaluation, the step metrics, the spans, the alerts.

    run = preset_run("demo_arithmetic.toml", 40, tmp_path)
    run.summary.eval_after, run.metrics(), run.watch.fired

Tests that share a run live in one module, so pytest-xdist's --dist loadfile gives them
one worker and the run is not repeated on the other.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from engine.api import MetricsEvent, RunSummary, run_local
from engine.config import RunConfig, load_config, validate_config
from engine.telemetry.sinks import MemorySink
from jobs.alerts.history import RunFacts

from .alert_watch import AlertWatch

CONFIGS_DIR = Path(__file__).parents[2] / "configs"


@dataclass(frozen=True)
class PresetRun:
    summary: RunSummary
    watch: AlertWatch
    cfg: RunConfig
    out: Path

    def of_type(self, cls) -> list:
        return [e for e in self.watch.events if isinstance(e, cls)]

    def metrics(self) -> list[dict[str, float]]:
        """Each step's metrics, in order."""
        return [e.values for e in self.of_type(MetricsEvent) if "reward/mean" in e.values]


def preset_run(preset: str, steps: int, out: Path, **sections) -> PresetRun:
    """configs/<preset> for ``steps`` steps, ``sections`` replacing the preset's own (whole
    sections, as a launch form would); run once per process for the same arguments, in the
    first caller's ``out``."""
    key = (preset, steps, json.dumps(sections, sort_keys=True))
    if key not in _RUNS:
        data = load_config(CONFIGS_DIR / preset).model_dump(mode="json", exclude_none=True)
        cfg = validate_config(data | sections | {"steps": steps, "max_seconds": None})
        watch = AlertWatch(RunFacts.from_config(cfg, "running"), deferred=True)
        _RUNS[key] = PresetRun(run_local(cfg, out, sink=watch), watch, cfg, out)
    return _RUNS[key]


def resume_last_step(run: PresetRun, out: Path) -> MemorySink:
    """The run's last step again, resumed in ``out`` from its checkpoint one step before
    the end (the run must checkpoint there: checkpoint.every_steps = steps - 1). The
    resume tests of a long run's placement read it: one more step on the run the learning
    test made, instead of a short run straight, a short run stopped and its resume."""
    name = f"step_{run.cfg.steps - 1:06d}"
    shutil.copytree(run.out / "checkpoints" / name, out / "checkpoints" / name)
    sink = MemorySink()
    summary = run_local(run.cfg, out, sink=sink, resume=True)
    assert (summary.status, summary.steps_done) == ("succeeded", run.cfg.steps), summary
    return sink


def step_values(sink, name: str) -> dict[int, float]:
    """{step: value} of one metric in a sink's (or an AlertWatch's) events."""
    return {e.step: e.values[name] for e in sink.events
            if isinstance(e, MetricsEvent) and name in e.values}


_RUNS: dict[tuple[str, int, str], PresetRun] = {}
