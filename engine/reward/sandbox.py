"""Runs an untrusted program against unit tests in a separate, contained process.

    result = run_tests("f=lambda x:x+3", [(0, 3), (2, 5)], Limits(timeout_s=2))
    result.reason    # pass | wrong_answer | crash | timeout | limit_exceeded
    result.passed    # [True, True]: one verdict per test

Two isolation modes (``isolation()`` says which one is in force):

    namespaces (root + unshare):  unshare --net --pid --mount --ipc --fork --kill-child
        stage 1 (sandbox_init.py, pid 1, root): private tmpfs /tmp, empty tmpfs over /etc,
            /root, /home, the project's top directory, ..., interpreter bound back read-only
        stage 2 (sandbox_harness.py, a uid of its own): rlimits, then the program
        no network (a fresh netns has only a downed loopback); no process survives pid 1
    rlimits (fallback, non-root only: root ignores RLIMIT_NPROC): a new session in a temp
        dir with a minimal env, rlimits, socket creation blocked inside the interpreter;
        the temp dir is removed afterwards

Both: wall-clock timeout (the whole process group is SIGKILLed), CPU-time, address-space,
file-size and process-count rlimits, ``python -I -S``, and a cap on the bytes read back.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROJECT = HERE.parents[1]
PYTHON = os.path.realpath(sys.executable)     # the base interpreter, not a venv shim
UID_BASE = 1_000_000     # sandbox uid = UID_BASE + pid of its outer process: unique, unused


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 2.0        # wall clock, from spawn to exit
    cpu_s: int = 2                # RLIMIT_CPU (SIGXCPU, then SIGKILL a second later)
    memory_mb: int = 256          # RLIMIT_AS
    file_size_kb: int = 1024      # RLIMIT_FSIZE
    max_processes: int = 16       # RLIMIT_NPROC of the sandbox's own uid
    output_kb: int = 64           # stdout + stderr read back before the sandbox is killed
    tmpfs_mb: int = 8             # size of the private /tmp (namespaces mode)


@dataclass
class SandboxResult:
    reason: str                   # pass | wrong_answer | crash | timeout | limit_exceeded
    passed: list[bool]
    detail: str                   # e.g. "signal 11", "limit:memory", "error:ZeroDivisionError"
    wall_s: float
    isolation: str                # "namespaces" or "rlimits"
    outputs: list = field(default_factory=list)

    @property
    def pass_fraction(self) -> float:
        return sum(self.passed) / len(self.passed) if self.passed else 0.0


class SandboxError(RuntimeError):
    """The sandbox itself could not be set up (never the program's fault)."""


@functools.cache
def namespaces_available() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--net", "--pid", "--mount", "--ipc", "--fork",
                            "--mount-proc", "true"], capture_output=True, timeout=30)
    return probe.returncode == 0


def isolation() -> dict[str, str]:
    """Which containment is in force on this machine."""
    if namespaces_available():
        return {"mode": "namespaces", "network": "fresh network namespace (no interfaces up)",
                "files": "private tmpfs /tmp; /etc, homes and the project hidden",
                "processes": "pid namespace, own uid with RLIMIT_NPROC"}
    return {"mode": "rlimits", "network": "socket creation blocked in the interpreter",
            "files": "temp working dir, minimal env", "processes": "process group, RLIMIT_NPROC"}


def hidden_paths() -> list[str]:
    """What the program must not see: config and secrets, homes, the project's tree."""
    top = "/" + PROJECT.parts[1] if len(PROJECT.parts) > 1 else str(PROJECT)
    paths = ["/etc", "/root", "/home", "/var/tmp", "/dev/shm", "/run", "/mnt", "/srv", top,
             str(Path.home())]
    # /tmp is a private tmpfs already (a checkout under /tmp is hidden by it); covering it
    # again would also cover the interpreter's prefix parked there.
    return sorted({p for p in paths if p not in ("/", "/usr", "/lib", "/lib64", "/bin", "/tmp")})


def run_tests(code: str, tests: list[tuple[int, int]], limits: Limits = Limits(),
              block_sockets: bool | None = None) -> SandboxResult:
    """Run ``code`` (which must define ``f``) on each test input; judge its outputs.
    Sockets are blocked inside the interpreter where no network namespace exists (or when
    ``block_sockets`` says so)."""
    use_ns = namespaces_available()
    if not use_ns and os.geteuid() == 0:
        raise SandboxError("running as root without unshare(1) namespaces: RLIMIT_NPROC "
                           "would not hold; run the reward workers as a non-root user")
    block = not use_ns if block_sockets is None else block_sockets
    job = json.dumps({"code": code, "inputs": [x for x, _ in tests], "cpu_s": limits.cpu_s,
                      "memory_mb": limits.memory_mb, "file_size_kb": limits.file_size_kb,
                      "max_processes": limits.max_processes, "block_sockets": block})
    harness = (HERE / "sandbox_harness.py").read_text()
    run = _Run(limits)
    if use_ns:
        exit_code = run.in_namespaces(harness, job)
    else:
        exit_code = run.in_session(harness, job)
    return _judge(run, exit_code, [y for _, y in tests], "namespaces" if use_ns else "rlimits")


class _Run:
    """One sandboxed process tree: spawn, read capped output, enforce the wall clock."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.out, self.err = bytearray(), bytearray()
        self.over_output = self.timed_out = False
        self.wall_s = 0.0

    def _watch(self, proc: subprocess.Popen) -> None:
        cap = self.limits.output_kb * 1024
        readers = [threading.Thread(target=self._drain, args=(s, buf, cap, proc), daemon=True)
                   for s, buf in ((proc.stdout, self.out), (proc.stderr, self.err))]
        for r in readers:
            r.start()
        t0 = time.monotonic()
        try:
            proc.wait(timeout=self.limits.timeout_s)
        except subprocess.TimeoutExpired:
            self.timed_out = True
            self._kill(proc)
            proc.wait()
        self.wall_s = time.monotonic() - t0
        for r in readers:
            r.join(timeout=5)

    def _drain(self, stream, buf: bytearray, cap: int, proc: subprocess.Popen) -> None:
        while chunk := stream.read1(65536):
            if len(self.out) + len(self.err) + len(chunk) > cap:
                self.over_output = True
                self._kill(proc)
                continue                      # keep draining so the writer sees EOF/EPIPE
            buf.extend(chunk)

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def in_namespaces(self, harness: str, job: str) -> int | None:
        r, w = os.pipe()
        proc = subprocess.Popen(
            ["unshare", "--net", "--pid", "--mount", "--ipc", "--fork", "--kill-child",
             "--mount-proc", PYTHON, "-I", "-S", str(HERE / "sandbox_init.py")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            pass_fds=(w,), start_new_session=True, cwd="/", env={"PATH": "/usr/bin:/bin"})
        os.close(w)
        try:
            proc.stdin.write(json.dumps({
                "harness": harness, "job": job, "uid": UID_BASE + proc.pid,
                "hide": hidden_paths(), "keep": sys.base_prefix, "python": PYTHON,
                "tmpfs_mb": self.limits.tmpfs_mb, "status_fd": w}).encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass
        self._watch(proc)
        with os.fdopen(r) as status:
            lines = status.read().split()         # EOF: pid 1 of the namespace has exited
        _wait_until_gone(UID_BASE + proc.pid)
        if "ready" not in lines and not self.timed_out:
            raise SandboxError(f"sandbox setup failed: {self.err.decode(errors='replace')[-500:]}")
        return int(lines[-1]) if len(lines) >= 3 and lines[-2] == "exit" else None

    def in_session(self, harness: str, job: str) -> int | None:
        work = tempfile.mkdtemp(prefix="rlplane-sandbox-")
        try:
            proc = subprocess.Popen(
                [PYTHON, "-I", "-S", "-c", harness, job], cwd=work,
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": work},
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True)
            self._watch(proc)
            self._kill(proc)                 # whatever the program left in its group
            rc = proc.returncode
            return None if rc is None else (128 - rc if rc < 0 else rc)
        finally:
            shutil.rmtree(work, ignore_errors=True)


def _wait_until_gone(uid: int, limit_s: float = 30.0) -> None:
    """Return once no process runs as ``uid``: after a SIGKILL the namespace's processes
    take a moment to die, and the caller is promised that none outlives run_tests."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and any(_uid_of(pid) == uid for pid in os.listdir("/proc")
                                              if pid.isdigit()):
        time.sleep(0.01)


def _uid_of(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            return next(int(li.split()[1]) for li in fh if li.startswith("Uid:"))
    except (OSError, StopIteration, ValueError):
        return None


def _judge(run: _Run, exit_code: int | None, expected: list[int], mode: str) -> SandboxResult:
    def result(reason: str, detail: str, passed=None, outputs=None) -> SandboxResult:
        return SandboxResult(reason, passed or [False] * len(expected), detail, run.wall_s,
                             mode, outputs or [])

    if run.over_output:
        return result("limit_exceeded", f"limit:output over {run.limits.output_kb} KiB")
    if run.timed_out:
        return result("timeout", f"wall clock over {run.limits.timeout_s} s")
    report = _last_json(run.out)
    if report is None:
        if exit_code in (128 + signal.SIGXCPU, 128 + signal.SIGKILL):
            return result("timeout", f"cpu time over {run.limits.cpu_s} s")
        if exit_code == 128 + signal.SIGXFSZ:
            return result("limit_exceeded", "limit:file_size")
        if exit_code is not None and exit_code > 128:
            return result("crash", f"signal {exit_code - 128}")
        return result("crash", f"exit {exit_code} without a report")
    if report.get("load_error"):
        kind = report["load_error"]
        return result("limit_exceeded" if kind.startswith("limit:") else "crash", kind)
    outputs, errors = report.get("outputs", []), report.get("errors", [])
    if len(outputs) != len(expected) or len(errors) != len(expected):
        return result("crash", "malformed report")
    passed = [e is None and o == y for o, e, y in zip(outputs, errors, expected, strict=True)]
    kinds = [e for e in errors if e]
    if any(k.startswith("limit:") for k in kinds):
        reason, detail = "limit_exceeded", next(k for k in kinds if k.startswith("limit:"))
    elif kinds:
        reason, detail = "crash", kinds[0]
    else:
        reason = "pass" if all(passed) else "wrong_answer"
        detail = f"{sum(passed)}/{len(passed)} tests pass"
    return result(reason, detail, passed, outputs)


def _last_json(data: bytearray) -> dict | None:
    lines = bytes(data).strip().splitlines()
    try:
        report = json.loads(lines[-1]) if lines else None
    except ValueError:
        return None
    return report if isinstance(report, dict) else None
