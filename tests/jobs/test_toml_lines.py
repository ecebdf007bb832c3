"""A config field's line in the operator's TOML text."""

from jobs.runs.toml_lines import line_of

TEXT = '''name = "demo"            # 1
[rollout]                  # 2
temperature = 9            # 3
stop = [                   # 4
  "[placement]",           # 5: inside an array, not a header
]                          # 6
[faults.straggler]         # 7
seconds = -1               # 8
[reward]                   # 9
system = """               # 10
rollout_workers = 3        # 11: inside a string, not a key
"""                        # 12
[[eval]]                   # 13
size = 1                   # 14
[[eval]]                   # 15
size = 2                   # 16
[placement]                # 17
"type" = "disaggregated"   # 18
'''


def test_a_key_is_found_under_its_own_table():
    assert line_of(TEXT, "name") == 1
    assert line_of(TEXT, "rollout.temperature") == 3
    assert line_of(TEXT, "faults.straggler.seconds") == 8
    assert line_of(TEXT, "placement.type") == 18        # a quoted key


def test_a_missing_key_points_at_its_table_and_an_unknown_table_at_nothing():
    assert line_of(TEXT, "placement.rollout_workers") == 17
    assert line_of(TEXT, "async_policy.max_staleness") is None


def test_arrays_of_tables_count_their_entries_and_strings_and_arrays_hide_nothing():
    assert line_of(TEXT, "eval.1.size") == 16
    assert line_of(TEXT, "eval.0.size") == 14
    assert line_of(TEXT, "rollout.stop") == 4
