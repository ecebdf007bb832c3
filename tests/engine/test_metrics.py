"""The metric vocabulary (engine/metrics.py) and the README's table of it."""

import re
from pathlib import Path

from engine import metrics as M

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_table() -> str:
    text = README.read_text()
    begin, end = "<!-- metrics:begin -->\n", "<!-- metrics:end -->"
    assert begin in text and end in text, "README.md lost its metrics:begin/end marks"
    return text[text.index(begin) + len(begin):text.index(end)]


def test_the_readme_lists_every_metric_and_phase_of_the_vocabulary_and_no_other():
    listed = set(re.findall(r"^\| `([^`]+)` \|", readme_table(), re.MULTILINE))
    defined = set(M.METRICS) | {f.template for f in M.FAMILIES} | set(M.PHASES)
    fix = "regenerate it: .venv/bin/python -m engine.metrics"
    assert not defined - listed, f"README.md misses {sorted(defined - listed)}; {fix}"
    assert not listed - defined, f"README.md lists unknown {sorted(listed - defined)}; {fix}"
    assert readme_table() == M.markdown_table(), f"README.md's units or meanings differ; {fix}"


def test_every_metric_says_what_it_means_in_a_table_cell():
    for metric in M.METRICS.values():
        assert metric.meaning, f"{metric.name} says nothing of what it means"
        assert "|" not in metric.meaning + metric.unit, f"{metric.name} breaks the table"


def test_a_family_spells_its_members_and_the_named_ones_among_them():
    assert M.PHASE_TIME.of(phase="rollout") == M.TIME_ROLLOUT_S == "time/rollout_s"
    assert M.DEVICE_PHASE_UTILIZATION.of(device="gpu:0", phase="learner") == \
        "device/utilization/gpu:0/learner"
    assert {M.PHASE_TIME.of(phase=p) for p in (*M.PHASES, M.WAITING, M.IDLE)} <= set(M.METRICS)


def test_the_names_are_plain_strings_so_events_and_rows_hold_what_they_held():
    assert type(M.REWARD_MEAN) is str and M.REWARD_MEAN == "reward/mean"
    assert M.METRICS[M.BUBBLE].unit == "fraction"


def test_a_family_reads_the_fields_back_from_a_members_name_and_only_from_one():
    assert M.DEVICE_PHASE_UTILIZATION.match("device/utilization/gpu:1/rollout") == {
        "device": "gpu:1", "phase": "rollout"}
    assert M.DEVICE_PHASE_UTILIZATION.match("device/utilization/gpu:1") is None
    assert M.DEVICE_PHASE_UTILIZATION.match("device/utilization/a/b/c") is None
