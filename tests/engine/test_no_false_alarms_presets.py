"""No false alarms, the small preset (see tests/engine/test_no_false_alarms.py for what is
run and why): a module of its own so that pytest-xdist's --dist loadfile can run it on one
worker while the long-tail preset runs on the other.

The small preset runs on the tiny model (as every preset here) and on the demo's task and
warm start (cached once for the learning tests): its own task (+, - and *) on the tiny
model needed its 600-step warm start, 150-190 s of CI alone, the costliest thing built for
these tests, before StuckReward had nothing true to name. What the rules read of its
recipe is its own: lr 5e-5, the KL term (kl_coef 0.01), its group and sampling."""

import pytest

from engine.config import load_config

from .alert_watch import assert_quiet
from .test_no_false_alarms import CONFIGS, PRESETS_THERE, TEST_STEPS, healthy_run, presets

DEMO = load_config(CONFIGS[0].parent / "demo_arithmetic.toml")


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("path", presets(PRESETS_THERE))
def test_a_healthy_preset_raises_no_alert_in_24_steps(path, tmp_path, capsys):
    watch = healthy_run(path, tmp_path,
                        warm_start=DEMO.warm_start.model_dump(mode="json", exclude_none=True),
                        task=DEMO.task.model_dump(mode="json", exclude_none=True))
    assert_quiet(watch, f"{path.name} (the demo's task and warm start)", TEST_STEPS, capsys)
