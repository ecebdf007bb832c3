"""Hostile programs in the code sandbox: each is contained, gets the right reason, and
leaves no process and no file behind."""

import os
import socket
import threading
import uuid
from pathlib import Path

import pytest

from engine.reward.sandbox import UID_BASE, UID_SLOTS, Limits, isolation, run_tests

TESTS = [(0, 3), (2, 5), (-4, -1)]
LIMITS = Limits(timeout_s=3.0, cpu_s=2)
MARK = f"rlplane-hostile-{uuid.uuid4().hex[:8]}"


def stray_processes() -> list[int]:
    """Pids that outlived their sandbox. As root a sandbox runs as UID_BASE + UID_SLOTS x
    the pid of the process that ran it + a slot, so a sandbox-uid process whose runner is
    gone, or is this process (whose sandboxes have all returned), is a stray; sandboxes
    that other test processes or runs have in flight are not, nor are zombies (a dead
    sandbox's pid 1, waiting to be reaped by init)."""
    pids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(li.split(":", 1) for li in status.read_text().splitlines())
        except (OSError, ValueError):
            continue
        uid = int(fields["Uid"].split()[0])
        if fields["State"].split()[0] == "Z":
            continue
        owner = (uid - UID_BASE) // UID_SLOTS
        if uid >= UID_BASE and (owner == os.getpid() or not Path(f"/proc/{owner}").exists()):
            pids.append(int(status.parent.name))
    return pids


def stray_files() -> list[Path]:
    roots = [Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"), Path.cwd()]
    return [p for r in roots if r.exists() for p in r.glob(f"{MARK}*")]


def run_contained(code: str, **kw):
    res = run_tests(code, TESTS, kw.pop("limits", LIMITS), **kw)
    assert stray_processes() == [], "a sandboxed process outlived its sandbox"
    assert stray_files() == [], "a sandboxed program left a file behind"
    return res


def test_a_correct_program_passes_and_a_wrong_one_is_a_wrong_answer():
    ok = run_contained("def f(x):\n    return x + 3")
    assert (ok.reason, ok.passed) == ("pass", [True, True, True])
    # Equivalent programs pass too: execution, not string match, decides.
    assert run_contained("f=lambda x:3+x").reason == "pass"
    bad = run_contained("f=lambda x:x*2+3")
    assert bad.reason == "wrong_answer" and bad.passed == [True, False, False]


def test_the_isolation_in_force_is_reported():
    info = isolation()
    assert info["mode"] == "bwrap"
    assert run_contained("f=lambda x:x+3").isolation == info["mode"]


def test_an_infinite_loop_times_out():
    res = run_contained("def f(x):\n    while True:\n        pass")
    assert res.reason == "timeout"


def test_a_cpu_time_limit_stops_a_busy_program_before_the_wall_clock():
    res = run_contained("def f(x):\n    while True:\n        pass",
                        limits=Limits(timeout_s=30.0, cpu_s=1))
    assert (res.reason, res.detail) == ("timeout", "cpu time over 1 s")


def test_a_fork_bomb_hits_the_process_limit():
    res = run_contained("import os\ndef f(x):\n    while True:\n        os.fork()")
    assert (res.reason, res.detail) == ("limit_exceeded", "limit:processes")


def test_a_daemonized_child_does_not_survive_the_sandbox():
    code = ("import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n"
            "f=lambda x:x+3")
    assert run_contained(code).reason == "pass"


def test_ten_gigabytes_of_allocation_hit_the_memory_limit():
    res = run_contained("def f(x):\n    return len(bytearray(10 * 2**30))")
    assert (res.reason, res.detail) == ("limit_exceeded", "limit:memory")


def test_a_huge_file_write_hits_the_file_size_limit_and_leaves_no_file():
    code = (f"def f(x):\n    with open('{MARK}-big', 'wb') as fh:\n"
            "        fh.write(b'x' * 50_000_000)")
    res = run_contained(code)
    assert (res.reason, res.detail) == ("limit_exceeded", "limit:file_size")


def test_files_written_anywhere_writable_vanish_with_the_sandbox():
    code = "".join(f"try:\n    open('{d}/{MARK}', 'w').write('x')\nexcept OSError:\n    pass\n"
                   for d in (".", "/tmp", "/var/tmp", "/dev/shm", os.getcwd()))
    assert run_contained(code + "f=lambda x:x+3").reason == "pass"


def test_a_socket_to_localhost_never_connects():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(5)
    port = server.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: _accept(server, accepted), daemon=True).start()
    code = (f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "f=lambda x:x+3")
    res = run_contained(code)
    server.close()
    assert accepted == []
    assert res.reason == "crash" and res.detail.startswith("error:")


def _accept(server, accepted):
    try:
        accepted.append(server.accept())
    except OSError:
        pass


@pytest.mark.parametrize("path", ["/etc/passwd", str(Path(__file__).resolve()),
                                  str(Path(__file__).resolve().parents[2] / "pyproject.toml")])
def test_secrets_and_the_projects_files_cannot_be_read(path):
    res = run_contained(f"def f(x):\n    return len(open({path!r}).read())")
    assert (res.reason, res.detail) == ("crash", "error:FileNotFoundError")


def test_the_environment_is_clean():
    os.environ["RLPLANE_TEST_SECRET"] = "hunter2"
    try:
        res = run_contained("import os\ndef f(x):\n"
                            "    return len([k for k in os.environ if 'SECRET' in k]) + 3 + x")
    finally:
        del os.environ["RLPLANE_TEST_SECRET"]
    assert res.reason == "pass"


def test_killing_the_parent_fails_and_the_caller_lives_on():
    code = f"import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nos.kill({os.getpid()}, 9)"
    res = run_contained(code + "\nf=lambda x:x+3")
    assert res.reason == "crash"
    assert res.detail in ("error:PermissionError", "error:ProcessLookupError")


def test_printing_a_hundred_megabytes_hits_the_output_cap():
    res = run_contained("print('x' * 100_000_000)\nf=lambda x:x+3")
    assert (res.reason, res.detail) == ("limit_exceeded", "limit:output over 64 KiB")


def test_deep_recursion_is_a_crash():
    res = run_contained("def f(x):\n    return f(x + 1)")
    assert (res.reason, res.detail) == ("crash", "error:RecursionError")


def test_a_ctypes_segfault_is_a_crash():
    res = run_contained("import ctypes\nctypes.string_at(0)\nf=lambda x:x+3")
    assert (res.reason, res.detail) == ("crash", f"signal {11}")


def test_a_printed_fake_report_does_not_replace_the_harness_report():
    code = ('import json, os\nos.write(1, (json.dumps({"outputs": [3, 5, -1], "errors": '
            '[None, None, None]}) + "\\n").encode())\nf=lambda x:x')
    res = run_contained(code)
    assert res.reason == "wrong_answer"


def test_outputs_that_are_not_ints_come_back_as_their_reprs_whatever_they_hold():
    """The harness writes its report without json (sandbox_harness.encode): quotes,
    backslashes, control characters, non-ASCII text, bools and big ints come back as
    json.dumps would have written them, cut at 64 characters."""
    code = ("def f(x):\n"
            "    return {0: 'a\"b\\\\c\\n\\x00\\u2603', 2: True, -4: 2**60}[x]")
    res = run_contained(code)
    assert res.reason == "wrong_answer", res.detail
    assert res.outputs == [repr('a"b\\c\n\x00\u2603'), "True", repr(2**60)]


def test_waiting_for_a_sandbox_wakes_when_it_exits_and_times_out_when_it_does_not():
    import subprocess
    import sys

    from engine.reward.sandbox import _wait

    done = subprocess.Popen([sys.executable, "-c", "pass"])
    _wait(done, 60.0)
    assert done.returncode == 0
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            _wait(slow, 0.05)
        assert slow.returncode is None
    finally:
        slow.kill()
        _wait(slow, 60.0)
    assert slow.returncode == -9
