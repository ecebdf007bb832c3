import os
import sys

import pytest

# What gives a test the database under pytest-django (which refuses it to any other test):
# the django_db marker, or one of these fixtures anywhere in its fixture closure.
DB_FIXTURES = {"db", "transactional_db", "django_db_reset_sequences",
               "django_db_serialized_rollback", "live_server"}


def pytest_configure(config):
    """Under pytest-xdist each worker gets its own share of the machine's cores, before
    torch starts its thread pool: every process it starts (Ray, a stack, vLLM, whose CPU
    binding reads this affinity) inherits that share. The demo learning test twice at
    once on 2 cores: 295 s, each torch on 2 threads (their threads wait on each other's
    time slices), against 105 s on a core each and 132 s for the two one after the other."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get(
        "PYTEST_XDIST_WORKER_COUNT")
    if not worker or not count:
        return
    cores, n = sorted(os.sched_getaffinity(0)), int(count)
    share = len(cores) // n
    if share == 0:
        return
    i = int(worker.removeprefix("gw")) % n
    os.sched_setaffinity(0, cores[i * share:(i + 1) * share])
    os.environ["OMP_NUM_THREADS"] = str(share)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(share)


def pytest_collection_modifyitems(items):
    """Mark every test that can reach the database ``db``: scripts/test runs exactly those
    again on PostgreSQL (``-m db``); a test without it cannot touch a database at all."""
    for item in items:
        if item.get_closest_marker("django_db") or DB_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.db)


# Where the suite's time goes, printed at its end (beside --durations=30's slowest tests),
# so the change that breaks CI's budget names itself: seconds per test directory, setup
# and teardown included (a module fixture's cost lands on its first test's directory).
_seconds_by_dir: dict[str, float] = {}
_tests_by_dir: dict[str, int] = {}


def pytest_runtest_logreport(report):
    directory = report.nodeid.split("::", 1)[0].rsplit("/", 1)[0]
    _seconds_by_dir[directory] = _seconds_by_dir.get(directory, 0.0) + report.duration
    if report.when == "call" or (report.when == "setup" and report.skipped):
        _tests_by_dir[directory] = _tests_by_dir.get(directory, 0) + 1


def pytest_terminal_summary(terminalreporter):
    if not _seconds_by_dir:
        return
    terminalreporter.section("time per test directory")
    for directory, seconds in sorted(_seconds_by_dir.items(), key=lambda kv: -kv[1]):
        terminalreporter.write_line(
            f"{seconds:8.1f}s  {_tests_by_dir.get(directory, 0):5d} tests  {directory}")
    terminalreporter.write_line(f"{sum(_seconds_by_dir.values()):8.1f}s  in all")
