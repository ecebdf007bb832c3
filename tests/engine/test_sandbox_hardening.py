"""The sandbox's containment layers, each shown by a hostile program (issue 19, items 1-3):
bubblewrap or nothing, a judge no report can crash, an allowlisted filesystem, the open-file
rlimit, a cgroup per sandbox, seccomp + no_new_privs, four device nodes, a private
mountinfo, and the same containment for a non-root reward worker."""

import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from engine.config import CodeTaskConfig, SandboxRewardConfig
from engine.reward import sandbox, sandbox_cgroup
from engine.reward.execution import SandboxVerifier
from engine.reward.sandbox import Limits, SandboxError, parse_report, require_isolation
from engine.tasks import CodeTask

from .test_sandbox import LIMITS, TESTS, run_contained

ROOT = Path(__file__).resolve().parents[2]
PASS_IF = "f=(lambda x:x+3) if {cond} else (lambda x:x)"


# ---------------------------------------------------------------- 1: no unsafe fallback

def test_without_bubblewrap_nothing_runs_and_the_error_names_the_field_and_the_fix(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(sandbox, "_isolated", False)
    with pytest.raises(SandboxError) as err:
        require_isolation()
    with pytest.raises(SandboxError):
        run_contained("f=lambda x:x+3")
    with pytest.raises(SandboxError):            # a run with the sandbox reward fails at start
        SandboxVerifier(SandboxRewardConfig(), CodeTask(CodeTaskConfig()))
    assert 'reward.type = "sandbox"' in str(err.value)
    assert "apt-get install -y bubblewrap" in str(err.value)


def test_the_program_runs_as_nobody_in_a_user_namespace_of_its_own():
    code = ("import os\nmap_ = open('/proc/self/uid_map').read().split()\n"
            + PASS_IF.format(cond="os.getuid() == 65534 and map_[0] == '65534' and "
                                  "map_[1] != '0' and os.getgid() == 65534"))
    assert run_contained(code).reason == "pass"


# ------------------------------------------------------------- 2: no report crashes the judge

FORGED = [
    '{"load_error": 5}', '{"load_error": ["limit:memory"]}', '{"load_error": null}',
    '{"outputs": [3, 5, -1], "errors": [1, 2, 3]}', '{"outputs": [{"a": 1}, 5, -1], '
    '"errors": [null, null, null]}', '{"outputs": [3, 5], "errors": [null, null]}',
    '{"outputs": [3, 5, -1], "errors": [null, null, null], "x": 1}', "[1, 2, 3]", "1e999",
    "[" * 100_000 + "]" * 100_000, '{"outputs": [3, 5, -1], "errors": [null, null, "%s"]}'
    % ("error:" + "A" * 200_000),
]


@pytest.mark.parametrize("forged", FORGED, ids=range(len(FORGED)))
def test_a_program_writing_any_report_to_the_harness_handle_gets_a_crash_verdict(forged):
    code = ("import __main__, os\n__main__.report.write(" + repr(forged) + " + '\\n')\n"
            "__main__.report.flush()\nos._exit(0)\nf=lambda x:x+3")
    res = run_contained(code, limits=Limits(timeout_s=5.0, output_kb=1024))
    assert (res.reason, res.passed) == ("crash", [False, False, False])
    assert res.detail == "exit 0 without a valid report"


def test_only_the_harness_report_shape_parses():
    assert parse_report(b'noise\n{"outputs": [3, "x"], "errors": [null, null]}\n', 2) == {
        "outputs": [3, "x"], "errors": [None, None]}
    assert parse_report(b'{"load_error": "error:SyntaxError"}', 2) == {
        "load_error": "error:SyntaxError"}
    assert parse_report(b'{"outputs": [true, 1], "errors": [null, null]}', 2) is None
    assert parse_report(b'{"load_error": "ok"}', 2) is None
    assert parse_report(b"", 2) is None


# ----------------------------------------------------------------- 3: namespace hardening

def test_only_the_allowlisted_trees_are_visible_and_the_root_is_read_only():
    top = "/" + Path(sandbox.PREFIX).parts[1]
    allowed = {"/usr", "/bin", "/lib", "/lib64", "/sbin", "/tmp", "/proc", "/dev", top}
    code = ("import os\nseen = {'/' + n for n in os.listdir('/')}\n"
            "try:\n    open('/x', 'w')\n    wrote = True\nexcept OSError:\n    wrote = False\n"
            f"under = os.listdir({top!r})\n"
            + PASS_IF.format(cond=f"seen <= {allowed!r} and not wrote and len(under) == 1"))
    assert run_contained(code).reason == "pass"
    for path in ("/opt", "/var", "/srv", "/work", "/sys", "/etc", str(ROOT)):
        res = run_contained(f"import os\nos.listdir({path!r})\nf=lambda x:x+3")
        assert (res.reason, res.detail) == ("crash", "error:FileNotFoundError"), path


def test_opening_thousands_of_files_hits_the_open_files_limit():
    code = "fds = [open('/dev/null') for _ in range(20_000)]\nf=lambda x:x+3"
    res = run_contained(code)
    assert (res.reason, res.detail) == ("limit_exceeded", "limit:open_files")


def test_a_cgroup_bounds_the_whole_tree_s_memory_not_each_process_s():
    assert sandbox_cgroup.kind() in ("v1", "v2"), "this machine, like CI, has writable cgroups"
    code = ("import os, time\nfor _ in range(3):\n    if os.fork() == 0:\n"
            "        b = b'x' * (90 * 2**20)\n        time.sleep(3)\n        os._exit(0)\n"
            "for _ in range(3):\n    os.wait()\nf=lambda x:x+3")
    res = run_contained(code, limits=Limits(timeout_s=10.0, memory_mb=128))
    assert (res.reason, res.detail) == ("limit_exceeded", "limit:memory (cgroup)")


DENIED = ["unshare", "setns", "mount", "ptrace", "kexec_load", "bpf", "keyctl", "add_key",
          "perf_event_open", "userfaultfd", "io_uring_setup", "open_by_handle_at"]


def test_seccomp_and_no_new_privs_deny_namespaces_mounts_ptrace_kexec_bpf_and_keys():
    from engine.reward.seccomp import syscall_numbers

    nr = syscall_numbers()
    code = ("import ctypes, os, threading\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "def denied(n, *a):\n    return libc.syscall(n, *a) == -1 and ctypes.get_errno() == 1\n"
            f"calls = all(denied(n, 0x10000000) for n in {[nr[n] for n in DENIED]!r})\n"
            "status = open('/proc/self/status').read()\n"
            f"clone_ns = denied({nr['clone']}, 0x10000000 | 17, 0, 0, 0, 0)\n"
            "t = threading.Thread(target=lambda: None)\nt.start()\nt.join()\n"
            "pid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\n"
            + PASS_IF.format(cond="calls and clone_ns and 'NoNewPrivs:\\t1' in status "
                                  "and 'Seccomp:\\t2' in status"))
    assert run_contained(code).reason == "pass"


def test_only_null_zero_random_and_urandom_are_device_nodes():
    code = ("import os, stat\nnodes = {n for n in os.listdir('/dev')\n"
            "         if stat.S_ISCHR(os.stat('/dev/' + n).st_mode) or "
            "stat.S_ISBLK(os.stat('/dev/' + n).st_mode)}\n"
            + PASS_IF.format(cond="nodes == {'null', 'zero', 'random', 'urandom'}"))
    assert run_contained(code).reason == "pass"
    for dev in ("/dev/fuse", "/dev/net/tun", "/dev/kvm", "/dev/shm"):
        res = run_contained(f"open({dev!r}, 'rb')\nf=lambda x:x+3")
        assert (res.reason, res.detail) == ("crash", "error:FileNotFoundError"), dev


def test_mountinfo_shows_only_the_sandbox_s_own_mounts():
    top = "/" + Path(sandbox.PREFIX).parts[1]
    code = ("points = [li.split()[4] for li in open('/proc/self/mountinfo')]\n"
            f"ok = all(p == '/' or p.split('/')[1] in {{'usr', 'dev', 'proc', 'tmp', "
            f"{top[1:]!r}}} for p in points)\n" + PASS_IF.format(cond="ok"))
    assert run_contained(code).reason == "pass"


# ------------------------------------------------- 1 again: a reward worker that is not root

UNPRIVILEGED_UID = 1_000 + os.getpid() % 50_000     # below UID_BASE: no sandbox uses it
HOSTILE = {
    "kill_every_process_of_my_uid": "import os\nos.kill(-1, 9)\nf=lambda x:x+3",
    "read_the_worker_environment": "import glob\n" + PASS_IF.format(
        cond="not any(b'hunter2' in open(p, 'rb').read() for p in glob.glob('/proc/*/environ'))"),
    "read_the_project": f"f=lambda x: len(open({str(ROOT / 'pyproject.toml')!r}).read())",
    "connect_out": "import socket\nsocket.create_connection(('127.0.0.1', PORT), 1)\n"
                   "f=lambda x:x+3",
    "raw_socket_module": "import _socket\n_socket.socket().connect(('127.0.0.1', PORT))\n"
                         "f=lambda x:x+3",
    "fork_bomb": "import os\ndef f(x):\n    while True:\n        os.fork()",
    "memory_tree": "import os, time\nfor _ in range(4):\n    if os.fork() == 0:\n"
                   "        b = b'x' * (90 * 2**20)\n        time.sleep(2)\n        os._exit(0)\n"
                   "for _ in range(4):\n    os.wait()\nf=lambda x:x+3",
    "ptrace_the_parent": "import ctypes\nf=lambda x: ctypes.CDLL(None).ptrace(16, "
                         "__import__('os').getppid(), 0, 0) + x + 3",
}
WORKER = """
import json, sys
sys.path[:0] = PATHS
from engine.reward.sandbox import Limits, run_tests
limits = Limits(timeout_s=3.0, cpu_s=2)
results = {{k: run_tests(v, {tests!r}, limits) for k, v in {hostile!r}.items()}}
print(json.dumps({{k: [r.reason, r.detail, r.degraded] for k, r in results.items()}}))
"""


def run_as_unprivileged_worker(script: str) -> subprocess.CompletedProcess:
    """Run ``script`` with this interpreter as a plain uid, as a non-root reward worker runs.
    As root, a private mount namespace makes what the worker imports reachable for that uid
    wherever the checkout lies (a clone in a folder only root may enter, a pyenv under
    /root): the interpreter's prefix is bound back in place under a world-readable tmpfs,
    this environment's site-packages at /mnt/sp, and the worker imports a copy of
    engine/; then setpriv drops root. Otherwise we are that worker already."""
    if os.geteuid() != 0:
        return subprocess.run([sys.executable, "-c", script.replace("PATHS", repr([str(ROOT)]))],
                              capture_output=True, text=True, timeout=300)
    prefix = os.path.realpath(sys.base_prefix)
    packages = sysconfig.get_paths()["purelib"]
    uid = str(UNPRIVILEGED_UID)
    with tempfile.TemporaryDirectory(prefix="rlw", dir="/tmp") as staged:
        os.chmod(staged, 0o755)
        shutil.copytree(ROOT / "engine", Path(staged) / "engine",
                        ignore=shutil.ignore_patterns("__pycache__"))
        subprocess.run(["chmod", "-R", "a+rX", staged], check=True)
        setup = ("set -e; mount -t tmpfs -o size=64k,mode=755 w /mnt; mkdir /mnt/p /mnt/sp; "
                 f"mount --bind {prefix} /mnt/p; mount --bind {packages} /mnt/sp; "
                 f"mount -t tmpfs -o mode=755 w /root; "
                 f"mkdir -p {prefix}; mount --bind /mnt/p {prefix}; exec \"$@\"")
        done = subprocess.run(
            ["unshare", "--mount", "sh", "-c", setup, "sh", "setpriv", f"--reuid={uid}",
             f"--regid={uid}", "--clear-groups", os.path.realpath(sys.executable), "-c",
             script.replace("PATHS", repr([staged, "/mnt/sp"]))],
            capture_output=True, text=True, timeout=300, cwd="/",
            env={"PATH": os.environ["PATH"], "RLPLANE_CANARY_SECRET": "hunter2"})
    if done.returncode != 0 and "No module named" in done.stderr:
        pytest.fail("the unprivileged worker could not import what it needs (a copy of "
                    f"engine/ in a world-readable folder, {packages} bound at /mnt/sp):\n"
                    + done.stderr[-2000:])
    return done


def test_a_non_root_worker_contains_what_the_old_fallback_let_through():
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    hostile = {k: v.replace("PORT", str(listener.getsockname()[1])) for k, v in HOSTILE.items()}
    canary = subprocess.Popen(["setpriv", f"--reuid={UNPRIVILEGED_UID}",
                               f"--regid={UNPRIVILEGED_UID}", "--clear-groups", "sleep", "120"]
                              ) if os.geteuid() == 0 else subprocess.Popen(["sleep", "120"])
    try:
        done = run_as_unprivileged_worker(WORKER.format(tests=TESTS,
                                                        hostile=hostile))
        assert done.returncode == 0, done.stderr[-2000:]
        verdicts = json.loads(done.stdout.splitlines()[-1])
        assert canary.poll() is None, "kill(-1, 9) reached a process outside the sandbox"
        with pytest.raises(BlockingIOError):
            listener.accept()                 # nothing reached the worker's loopback
    finally:
        canary.kill()
        canary.wait()
        listener.close()
    reasons = {k: tuple(v[:2]) for k, v in verdicts.items()}
    assert {k: v for k, v in reasons.items() if k != "memory_tree"} == {
        "kill_every_process_of_my_uid": ("crash", "error:ProcessLookupError"),
        "read_the_worker_environment": ("pass", "3/3 tests pass"),
        "read_the_project": ("crash", "error:FileNotFoundError"),
        "connect_out": ("crash", "error:ConnectionRefusedError"),   # its own loopback
        "raw_socket_module": ("crash", "error:ConnectionRefusedError"),
        "fork_bomb": ("limit_exceeded", "limit:processes"),
        "ptrace_the_parent": ("wrong_answer", "0/3 tests pass"),
    }
    degraded = {v[2] for v in verdicts.values()}
    if os.geteuid() == 0:          # the dropped uid cannot write this machine's cgroups
        [note] = degraded
        assert "no per-sandbox cgroup" in note and "polled" in note
        assert reasons["memory_tree"] == ("limit_exceeded", "limit:memory (tree)")
    assert not [p for p in Path("/proc").glob("[0-9]*/status")       # zombies: reaped pid 1s
                if f"Uid:\t{UNPRIVILEGED_UID}\t" in (st := _read(p)) and "State:\tZ" not in st
                ], "a process outlived its sandbox"


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def test_the_default_limits_still_pass_a_correct_program():
    assert run_contained("f=lambda x:x+3", limits=LIMITS).reason == "pass"
