import os
import sys
import threading

import pytest

from . import shared

# What gives a test the database under pytest-django (which refuses it to any other test):
# the django_db marker, or one of these fixtures anywhere in its fixture closure.
DB_FIXTURES = {"db", "transactional_db", "django_db_reset_sequences",
               "django_db_serialized_rollback", "live_server"}


def pytest_configure(config):
    """Under pytest-xdist each worker's torch runs one thread, before its pool starts,
    and so does every process it starts (Ray, a stack, a bench inherit OMP_NUM_THREADS);
    a vLLM engine binds its OpenMP thread to the worker's own core. The demo learning
    test twice at once on 2 cores: 295 s with torch on 2 threads each (the threads wait on
    each other's time slices), 105 s on one thread each, 132 s one after the other. The
    workers are not pinned to a core: a stack (uvicorn, Celery, Redis, a Ray head, the
    run's driver, chromium) squeezed onto one missed its e2e tests' deadlines."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get(
        "PYTEST_XDIST_WORKER_COUNT")
    if not worker or not count:
        return
    cores = sorted(os.sched_getaffinity(0))
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(cores[int(worker.removeprefix("gw"))
                                                        % len(cores)])
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


def pytest_collection_modifyitems(items):
    """Mark every test that can reach the database ``db``: scripts/test runs exactly those
    again on PostgreSQL (``-m db``); a test without it cannot touch a database at all.
    Runs before pytest's own -m selection (conftest hooks before the mark plugin's)."""
    for item in items:
        if item.get_closest_marker("django_db") or DB_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.db)
    shared.group_users(items)
    misplaced = misplaced_by_pass(items)
    if misplaced:
        raise pytest.UsageError(
            "scripts/test runs the e2e tests from tests/e2e and the serial ones from the files "
            "that say pytest.mark.serial; these would run in no pass: " + ", ".join(misplaced))
    # Under pytest-xdist, the longest files first, in a stable sort (within a file, and
    # among files of equal weight, the order stays pytest-django's, whose hook runs before
    # this one): xdist hands out files in this order (scripts/test: --no-loadscope-reorder),
    # so no long file starts last while the other worker idles, and the many quick ones
    # fill the end on both workers. One process keeps the plain order.
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    weight: dict[str, float] = {}
    for item in items:
        f = file_of(item.nodeid)
        weight[f] = weight.get(f, 0.0) + SLOW_TEST_S * bool(item.get_closest_marker("slow"))
    weight.update({f: s for f, s in CI_FILE_SECONDS.items() if f in weight})
    items.sort(key=lambda item: -weight[file_of(item.nodeid)])


# What the longest files took in their pass (setup included; this machine type, an AMD
# EPYC 2-core, 2026-12-05, the "time per test file" section each pass prints, after the
# torch sampler's prefix cache). Ordering by the count of slow tests started the
# sandbox learning module among the last and left one worker ~90 s alone at the end. A
# file not named weighs SLOW_TEST_S per slow test; a stale figure only reorders, it cannot
# fail a test.
SLOW_TEST_S = 8.0
CI_FILE_SECONDS = {
    "tests/engine/test_no_false_alarms.py": 358,   # repair 178 s, long-tail 107, guess 54
    "tests/engine/test_learning.py": 295,
    "tests/engine/test_bench_smoke.py": 184,
    "tests/engine/test_async_ray.py": 146,
    "tests/engine/test_gsm8k_sample.py": 142,   # three path-model runs, 43-49 s each
    "tests/engine/test_reward_learning.py": 104,
    "tests/engine/test_faults_async.py": 82,
    "tests/engine/test_reward_overopt.py": 61,
    "tests/jobs/test_tasks.py": 53,
    "tests/engine/test_faults.py": 51,
    "tests/engine/test_hf_models_vllm.py": 48,
    "tests/jobs/test_multinode.py": 46,   # the PostgreSQL pass only (postgres_only)
    "tests/engine/test_sharded_ray.py": 46,
    "tests/engine/test_env_learning.py": 38,
    "tests/engine/test_transports_vllm.py": 33,
    "tests/test_stack.py": 33,
    "tests/test_bench_ingest_smoke.py": 29,
    "tests/engine/test_reward_service.py": 28,
    "tests/engine/test_vllm_backend.py": 23,
    "tests/jobs/test_rest_schemathesis.py": 21,
    "tests/engine/test_resizing.py": 21,
    "tests/engine/test_learner.py": 30,   # learner.compile's test: inductor, ~18-27 s
    # the e2e pass (its own two workers)
    "tests/e2e/test_stack_drills.py": 94,
    "tests/e2e/test_chaos_drills.py": 93,
    "tests/e2e/test_browser.py": 79,
    "tests/e2e/test_operate_remotely.py": 66,
    "tests/e2e/test_inspector_browser.py": 39,
    "tests/e2e/test_alerts_browser.py": 30,
    "tests/e2e/test_external_trl_browser.py": 26,
}


def pytest_collection_finish(session):
    """After -m and -k: the last test to use each shared thing (tests/shared.py)."""
    shared.note_last_users(session.items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """A shared thing stops right after the last test that uses it: its cost shows on that
    test's teardown row, and it does not idle beside the tests after it."""
    try:
        return (yield)
    finally:
        for thing in shared.REGISTRY:
            if thing.last_user is item:
                thing.stop()


def pytest_sessionfinish(session):
    """What is still up (an interrupted session, a last user another xdist worker ran)."""
    for thing in shared.REGISTRY:
        try:
            thing.stop()
        except Exception as exc:    # no test's teardown left to report it on
            print(f"\n{thing.fixture} did not stop cleanly: {exc!r}", file=sys.stderr)
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def alerts_in_the_ingest_call(settings):
    """The alert rules run in the ingest call, right after its transaction
    (RLPLANE_ALERT_DEBOUNCE_S=0), so a test that ingests sees its alerts at once: its
    transaction never commits, and a debounced evaluation waits for a commit.
    tests/jobs/test_alerts_debounce.py drives the debounced path deployments run."""
    settings.RLPLANE_ALERT_DEBOUNCE_S = 0


@pytest.fixture(autouse=True)
def what_commits_taught_a_process_is_rolled_back_with_the_test():
    """A process remembers what committed: the staging tables its connection made
    (jobs.ingest.bulk.STAGED), the alert rules' history per run (jobs.alerts.recent) and
    runs' own throughput baselines (jobs.alerts.lifecycle.OWN_BASELINES).
    A test that runs its on-commit callbacks (django_capture_on_commit_callbacks) records
    them, and then its transaction rolls back: the next test on the connection would
    COPY into a temp table that is gone, or read a history of events that are."""
    yield
    if (bulk := sys.modules.get("jobs.ingest.bulk")) is not None:
        bulk.STAGED.clear()
    if (recent := sys.modules.get("jobs.alerts.recent")) is not None:
        recent.forget()
    if (lifecycle := sys.modules.get("jobs.alerts.lifecycle")) is not None:
        lifecycle.OWN_BASELINES.clear()


@pytest.fixture(autouse=True)
def pool_threads_let_go_of_their_connections():
    """The ingest threads (jobs.ingest.endpoints) and the sockets' session-check thread
    (jobs.socket_logins) keep a database connection from one use to the next (CONN_MAX_AGE):
    after a test that used them, each thread closes its own, or PostgreSQL refuses to drop
    the test database ("being accessed by other users")."""
    yield
    pools = [pool for module, name in (("jobs.ingest.endpoints", "INGEST_THREADS"),
                                       ("jobs.socket_logins", "checks"))
             if (pool := getattr(sys.modules.get(module), name, None)) is not None]
    for pool in pools:
        threads = len(pool._threads)
        if threads:
            from django.db import connections

            # Each thread takes exactly one: none returns until all of them have one.
            barrier = threading.Barrier(threads)
            closing = [pool.submit(close_then_wait, connections, barrier)
                       for _ in range(threads)]
            for future in closing:
                future.result()


def close_then_wait(connections, barrier: threading.Barrier) -> None:
    connections.close_all()
    barrier.wait(30)


@pytest.fixture
def shared_ray_head(monkeypatch):
    """The session's Ray head (tests/shared.py), its runs' jobs under a name of this
    test's own; the jobs it left running are stopped after it."""
    from jobs.cluster import ray as ray_cluster

    head = shared.RAY_HEAD.get()
    monkeypatch.setattr(ray_cluster, "SUBMISSION_PREFIX", shared.ray_submission_prefix())
    yield head
    if not shared.end_jobs(head):
        shared.RAY_HEAD.stop()


@pytest.fixture
def shared_stack():
    """The session's browser stack (tests/shared.py): its web URL. Built anew for the next
    test when this one left a run unfinished."""
    url, state = shared.BROWSER_STACK.get()
    yield url
    if shared.unfinished_runs(state):
        shared.BROWSER_STACK.stop()


def misplaced_by_pass(items) -> list[str]:
    """The tests scripts/test's later passes would not collect: an e2e test outside
    tests/e2e, a serial test whose file does not name the marker (a conftest marked it)."""
    text: dict[str, str] = {}
    out = []
    for item in items:
        f = file_of(item.nodeid)
        if item.get_closest_marker("e2e") and not f.startswith("tests/e2e/"):
            out.append(item.nodeid)
        elif item.get_closest_marker("serial"):
            if f not in text:
                text[f] = item.path.read_text()
            if "pytest.mark.serial" not in text[f]:
                out.append(item.nodeid)
    return out


def file_of(nodeid: str) -> str:
    """tests/engine/test_loop.py of tests/engine/test_loop.py::test_x[param]."""
    return nodeid.split("::", 1)[0]


# Where the suite's time goes, printed at its end (beside --durations=30's slowest tests),
# so the change that breaks CI's budget names itself: seconds per test directory, setup
# and teardown included (a module fixture's cost lands on its first test's directory).
_seconds_by_dir: dict[str, float] = {}
_tests_by_dir: dict[str, int] = {}


_seconds_by_file: dict[str, float] = {}


def pytest_runtest_logreport(report):
    directory = file_of(report.nodeid).rsplit("/", 1)[0]
    _seconds_by_dir[directory] = _seconds_by_dir.get(directory, 0.0) + report.duration
    f = file_of(report.nodeid)
    _seconds_by_file[f] = _seconds_by_file.get(f, 0.0) + report.duration
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
    terminalreporter.section("time per test file (the 20 longest: CI_FILE_SECONDS)")
    for f, seconds in sorted(_seconds_by_file.items(), key=lambda kv: -kv[1])[:20]:
        terminalreporter.write_line(f"{seconds:8.1f}s  {f}")
