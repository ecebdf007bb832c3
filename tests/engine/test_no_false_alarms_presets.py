"""No false alarms, the small preset (see tests/engine/test_no_false_alarms.py for what is
run and why): a module of its own so that pytest-xdist's --dist loadfile can run it on one
worker while the long-tail preset runs on the other."""

import pytest

from .alert_watch import assert_quiet
from .test_no_false_alarms import PRESETS_THERE, TEST_STEPS, healthy_run, presets


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("path", presets(PRESETS_THERE))
def test_a_healthy_preset_raises_no_alert_in_24_steps(path, tmp_path, capsys):
    assert_quiet(healthy_run(path, tmp_path), path.name, TEST_STEPS, capsys)
