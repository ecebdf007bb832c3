"""Runs an untrusted program against unit tests in a separate, contained process.

    result = run_tests("f=lambda x:x+3", [(0, 3), (2, 5)], Limits(timeout_s=2))
    result.reason    # pass | wrong_answer | crash | timeout | limit_exceeded
    result.passed    # [True, True]: one verdict per test

There is one mode, bubblewrap (Debian's ``bwrap``), as flatpak and nsjail-style judges do;
without it (or without user namespaces) ``run_tests`` refuses to run anything
(``require_isolation`` says why and how to fix it). No unsafe fallback exists.

    [cgroup]    echo 0 > <the sandbox's cgroup>/cgroup.procs    (sandbox_cgroup.py)
    [root]      unshare --mount: park the interpreter's prefix where an unprivileged uid
                can reach it (a pyenv under /root is not; skipped when it is reachable),
                then setpriv to a uid of its own (UID_BASE + 64 x worker pid + slot)
    [non-root]  bwrap directly: outside its namespaces the program has the worker's uid,
                but it can name none of the worker's processes and see none of its files
    bwrap --unshare-user/pid/net/ipc/uts/cgroup --disable-userns --uid/--gid 65534
          --die-with-parent --new-session --clearenv --seccomp FD (seccomp.py; no_new_privs)
          /      an empty tmpfs, remounted read-only; only these appear in it:
          /usr, the interpreter's prefix        read-only binds (the allowlist)
          /bin /lib /lib64 /sbin                as on the host (symlinks into /usr, or ro)
          /tmp   private tmpfs of tmpfs_mb, the working dir; dies with the sandbox
          /dev   null zero random urandom only;  /proc of the sandbox's own pid namespace
      -> python -I -S sandbox_harness.py: rlimits (cpu, address space, file size,
         processes, open files, core) -> the program -> one JSON report line on stdout

No network (a fresh netns: nothing but its own loopback), no project, no /etc, no homes, no
environment. RLIMIT_NPROC counts per user namespace (Linux >= 5.14), so it counts the
sandbox's own processes only. When the sandbox's pid 1 exits the kernel kills the rest of
its namespace, and ``run_tests`` returns only after that. Wall-clock timeout, output cap,
and a report parsed as untrusted data: anything but the expected shape is a crash verdict.
"""

from __future__ import annotations

import functools
import json
import logging
import marshal
import os
import select
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from engine.reward import sandbox_cgroup
from engine.reward.seccomp import filter_program

HERE = Path(__file__).resolve().parent
HARNESS = (HERE / "sandbox_harness.py").read_text()
PYTHON = os.path.realpath(sys.executable)     # the base interpreter, not a venv shim
PREFIX = os.path.realpath(sys.base_prefix)
UID_BASE = 100_000_000   # as root: sandbox uid = UID_BASE + 64 x pid of the caller + slot
UID_SLOTS = 64           # sandboxes one process may run at once (more wait for a slot)
SANDBOX_ID = 65534       # the uid and gid inside: nobody
DEVICES = ("null", "zero", "random", "urandom")
MEMORY_POLL_S = 0.02     # without a cgroup: how often the tree's memory is summed
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 2.0        # wall clock, from spawn to exit
    cpu_s: int = 2                # RLIMIT_CPU (SIGXCPU, then SIGKILL a second later)
    memory_mb: int = 256          # RLIMIT_AS per process, and the cgroup's total
    file_size_kb: int = 1024      # RLIMIT_FSIZE
    max_processes: int = 16       # RLIMIT_NPROC in the sandbox's user namespace, pids.max
    open_files: int = 64          # RLIMIT_NOFILE
    output_kb: int = 64           # stdout + stderr read back before the sandbox is killed
    tmpfs_mb: int = 8             # size of the private /tmp


@dataclass
class SandboxResult:
    reason: str                   # pass | wrong_answer | crash | timeout | limit_exceeded
    passed: list[bool]
    detail: str                   # e.g. "signal 11", "limit:memory", "error:ZeroDivisionError"
    wall_s: float
    isolation: str                # "bwrap"
    outputs: list = field(default_factory=list)
    degraded: str | None = None   # why a containment layer is missing here (no cgroup), or None


class SandboxError(RuntimeError):
    """The sandbox itself could not be set up (never the program's fault)."""


def isolation() -> dict[str, str]:
    """Which containment is in force on this machine."""
    degraded = sandbox_cgroup.degraded_reason()
    return {"mode": "bwrap", "network": "fresh network namespace (its own loopback only)",
            "files": "allowlist: /usr and the interpreter read-only, private tmpfs /tmp",
            "processes": "user+pid namespaces, uid nobody, seccomp, no_new_privs",
            "cgroup": degraded or f"{sandbox_cgroup.kind()}: total memory and pids bounded"}


def _probe() -> str | None:
    """Why the sandbox cannot run here, or None: one trivial program under the real setup."""
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed"
    if os.geteuid() == 0 and (shutil.which("setpriv") is None or shutil.which("unshare") is None):
        return "setpriv/unshare (util-linux) are missing"
    try:
        out = _Run(Limits(timeout_s=30.0, cpu_s=10)).go("import sys\nsys.stdout.write('ok')")
    except SandboxError as exc:
        return str(exc)
    return None if out.out.endswith(b"ok") else (
        f"a trivial program did not run: {bytes(out.err).decode(errors='replace')[-300:]}")


_isolated = False     # set by the first probe that succeeds (a failed one is retried)


def require_isolation() -> None:
    """Raise a SandboxError naming the fix unless programs can run isolated here."""
    global _isolated
    why = None if _isolated else _probe()
    if why is not None:
        raise SandboxError(
            f'reward.type = "sandbox" (and the code task\'s checks) run untrusted programs '
            f"only under bubblewrap with user namespaces, and here {why}. Fix: "
            "`apt-get install -y bubblewrap` (scripts/setup does it as root) and allow user "
            "namespaces (sysctl user.max_user_namespaces > 0, "
            "kernel.unprivileged_userns_clone=1 where it exists), or choose another "
            "reward.type")
    _isolated = True
    degraded = sandbox_cgroup.degraded_reason()
    if degraded:
        _warn_once(degraded)


@functools.cache
def _warn_once(message: str) -> None:
    log.warning("sandbox degraded: %s", message)


def run_tests(code: str, tests: list[tuple[int, int]], limits: Limits = Limits()) -> SandboxResult:
    """Run ``code`` (which must define ``f``) on each test input; judge its outputs."""
    require_isolation()
    run = _Run(limits).go(HARNESS, stdin=job_bytes(code, [x for x, _ in tests], limits))
    return _judge(run, [y for _, y in tests])


def job_bytes(code: str, inputs: list[int], limits: Limits) -> bytes:
    """What sandbox_harness.py reads on stdin: marshalled (it imports no json)."""
    return marshal.dumps({"code": code, "inputs": list(inputs), "cpu_s": limits.cpu_s,
                          "memory_mb": limits.memory_mb, "file_size_kb": limits.file_size_kb,
                          "max_processes": limits.max_processes,
                          "open_files": limits.open_files})


_slots = threading.BoundedSemaphore(UID_SLOTS)
_free = list(range(UID_SLOTS))
_free_lock = threading.Lock()


class _Run:
    """One sandboxed process tree: spawn, read capped output, enforce the wall clock."""

    def __init__(self, limits: Limits):
        self.limits = limits
        self.out, self.err = bytearray(), bytearray()
        self.over_output = self.timed_out = False
        self.wall_s = 0.0
        self.exit_code: int | None = None
        self.oom_kills = 0
        self.watch_memory = self.over_memory = False

    def go(self, script: str, stdin: bytes = b"") -> _Run:
        with _slots:
            with _free_lock:
                slot = _free.pop()
            try:
                self._go(UID_BASE + UID_SLOTS * os.getpid() + slot, script, stdin)
            finally:
                with _free_lock:
                    _free.append(slot)
        return self

    def _go(self, uid: int, script: str, stdin: bytes) -> None:
        cg = sandbox_cgroup.create(f"rlplane-sandbox-{uid}", self.limits.memory_mb,
                                   self.limits.max_processes)
        self.watch_memory = cg is None
        try:
            child = self._spawn(uid, cg, script, stdin)
        finally:
            if cg is not None:
                self.oom_kills = cg.oom_kills()
                cg.remove()
        if child is None and not self.timed_out:
            raise SandboxError("sandbox setup failed: "
                               + bytes(self.err).decode(errors="replace")[-500:])

    def _spawn(self, uid: int, cg, script: str, stdin: bytes) -> int | None:
        """Run the tree to its end; the pid of its pid 1 (None if bwrap never cloned it)."""
        seccomp_r, seccomp_w = os.pipe()
        info_r, info_w = os.pipe()
        os.write(seccomp_w, filter_program())
        os.close(seccomp_w)
        cmd = _launcher(uid, cg, seccomp_r, info_w, self.limits.tmpfs_mb,
                        [PYTHON, "-I", "-S", "-c", script])
        with os.fdopen(info_r, "rb") as info:
            try:
                proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, pass_fds=(seccomp_r, info_w),
                                        start_new_session=True, cwd="/",
                                        env={"PATH": "/usr/bin:/bin"})
            finally:
                os.close(seccomp_r)
                os.close(info_w)
            threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True).start()
            child = _child_pid(info.read())      # EOF once bwrap has cloned its pid 1
        self._watch(proc, child)
        if child is not None:
            _wait_until_dead(child)
        rc = proc.returncode
        self.exit_code = None if rc is None else (128 - rc if rc < 0 else rc)
        return child

    def _watch(self, proc: subprocess.Popen, child: int | None) -> None:
        cap = self.limits.output_kb * 1024
        kill = functools.partial(self._kill, proc, child)
        readers = [threading.Thread(target=self._drain, args=(s, buf, cap, kill), daemon=True)
                   for s, buf in ((proc.stdout, self.out), (proc.stderr, self.err))]
        for r in readers:
            r.start()
        t0 = time.monotonic()
        deadline = t0 + self.limits.timeout_s
        # Without a cgroup the tree's memory is watched from here instead (its summed PSS,
        # every MEMORY_POLL_S): coarser than memory.max, but a bound on the whole tree.
        watch = child is not None and self.watch_memory
        while True:
            left = deadline - time.monotonic()
            try:
                _wait(proc, max(0.0, min(left, MEMORY_POLL_S) if watch else left))
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() >= deadline:
                    self.timed_out = True
                elif _tree_pss(child) > self.limits.memory_mb * 2**20:
                    self.over_memory = True
                else:
                    continue
                kill()
                proc.wait()
                break
        self.wall_s = time.monotonic() - t0
        for r in readers:
            r.join(timeout=5)

    def _drain(self, stream, buf: bytearray, cap: int, kill) -> None:
        while chunk := stream.read1(65536):
            if len(self.out) + len(self.err) + len(chunk) > cap:
                self.over_output = True
                kill()
                continue                      # keep draining so the writer sees EOF/EPIPE
            buf.extend(chunk)

    @staticmethod
    def _kill(proc: subprocess.Popen, child: int | None) -> None:
        """SIGKILL the sandbox's pid 1: the kernel empties its namespace before bwrap can
        reap it, so bwrap's exit means nothing of the program is left."""
        for kill, pid in ((os.kill, child), (os.killpg, proc.pid)):
            if pid is None:
                continue
            try:
                kill(pid, signal.SIGKILL)
                return
            except ProcessLookupError:
                pass


def _wait(proc: subprocess.Popen, timeout: float) -> None:
    """``proc.wait(timeout)``, woken by the kernel the moment the process exits (a pidfd
    polled): Popen.wait's own polling sleeps 0.5, 1, 2, ... up to 50 ms between looks, so
    a sandbox whose program was done 12 ms after bwrap cloned it was reaped ~32 ms after
    (a whole run_tests: 54 ms, serially). Popen's way where pidfds are missing (Linux <
    5.3) or the pid is gone (reaped by someone else: Popen then reports it)."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        proc.wait(timeout=timeout)
        return
    try:
        poller = select.poll()            # not select(): a worker may hold fds past 1024
        poller.register(fd, select.POLLIN)
        if not poller.poll(timeout * 1000):
            raise subprocess.TimeoutExpired(proc.args, timeout)
    finally:
        os.close(fd)
    proc.wait()


def _tree_pss(root: int) -> int:
    """Proportional set size, in bytes, of ``root`` and every process below it (the
    sandbox's pid 1 and, reparented to it, anything the program forked)."""
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
                total += next((int(li.split()[1]) * 1024 for li in fh if li.startswith(b"Pss:")),
                              0)
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children", "rb") as fh:
                    todo += [int(c) for c in fh.read().split()]
        except (OSError, ValueError):
            continue                      # it exited meanwhile
    return total


def _feed(pipe, data: bytes) -> None:
    try:
        pipe.write(data)
        pipe.close()
    except OSError:           # the sandbox died first; its verdict says why
        pass


def _wait_until_dead(pid: int, limit_s: float = 30.0) -> None:
    """bwrap exits as soon as its pid 1 reports the program's status, a moment before that
    pid 1 has exited; a zombie pid 1 means the kernel has emptied its namespace."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                if fh.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    return
        except (FileNotFoundError, ProcessLookupError, IndexError):
            return
        time.sleep(0.002)


def _child_pid(info: bytes) -> int | None:
    try:
        pid = json.loads(info or b"null")
        return pid["child-pid"] if isinstance(pid, dict) else None
    except (ValueError, KeyError):
        return None


def _launcher(uid: int, cg: sandbox_cgroup.Cgroup | None, seccomp_fd: int, info_fd: int,
              tmpfs_mb: int, command: list[str]) -> list[str]:
    """argv that enters the cgroup, drops root (if root) and execs bwrap with ``command``."""
    root = os.geteuid() == 0
    steps = [f"echo 0 > {shlex.quote(str(d / 'cgroup.procs'))}" for d in cg.dirs] if cg else []
    prefix_src, private_mounts = PREFIX, root and not _reachable_by_others(PREFIX)
    if private_mounts:                       # in our own mount namespace, gone with it
        prefix_src = "/tmp/rlplane-python"
        steps += ["mount -t tmpfs -o size=64k,mode=755 rlplane /tmp",
                  f"mkdir {prefix_src}", f"mount --bind -o ro {shlex.quote(PREFIX)} {prefix_src}"]
    drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"] if root else []
    argv = [*drop, *_bwrap_args(prefix_src, seccomp_fd, info_fd, tmpfs_mb), *command]
    if not steps:
        return argv
    shell = ["sh", "-c", "set -e; " + "; ".join(steps) + '; exec "$@"', "sh", *argv]
    return ["unshare", "--mount", "--propagation", "private", *shell] if private_mounts else shell


def _bwrap_args(prefix_src: str, seccomp_fd: int, info_fd: int, tmpfs_mb: int) -> list[str]:
    args = ["bwrap", "--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup-try", "--disable-userns",
            "--uid", str(SANDBOX_ID), "--gid", str(SANDBOX_ID), "--hostname", "sandbox",
            "--die-with-parent", "--new-session", "--clearenv",
            "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8",
            "--setenv", "HOME", "/tmp", "--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/lib", "/lib64", "/sbin"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    if not PREFIX.startswith("/usr/"):
        args += ["--ro-bind", prefix_src, PREFIX]
    for dev in DEVICES:
        args += ["--dev-bind", f"/dev/{dev}", f"/dev/{dev}"]
    args += ["--symlink", "/proc/self/fd", "/dev/fd", "--proc", "/proc",
             "--perms", "1777", "--size", str(tmpfs_mb * 2**20), "--tmpfs", "/tmp",
             "--remount-ro", "/", "--chdir", "/tmp",
             "--seccomp", str(seccomp_fd), "--info-fd", str(info_fd), "--"]
    return args


def _reachable_by_others(path: str) -> bool:
    """Whether a uid that is neither owner nor group can walk down to ``path``."""
    p = Path(path)
    return all(os.stat(d).st_mode & 0o001 for d in [*reversed(p.parents), p])


def _judge(run: _Run, expected: list[int]) -> SandboxResult:
    degraded = sandbox_cgroup.degraded_reason()

    def result(reason: str, detail: str, passed=None, outputs=None) -> SandboxResult:
        return SandboxResult(reason, passed or [False] * len(expected), detail, run.wall_s,
                             "bwrap", outputs or [], degraded)

    exit_code = run.exit_code
    if run.over_output:
        return result("limit_exceeded", f"limit:output over {run.limits.output_kb} KiB")
    if run.oom_kills:
        return result("limit_exceeded", "limit:memory (cgroup)")
    if run.over_memory:
        return result("limit_exceeded", "limit:memory (tree)")
    if run.timed_out:
        return result("timeout", f"wall clock over {run.limits.timeout_s} s")
    report = parse_report(run.out, len(expected))
    if report is None:
        if exit_code in (128 + signal.SIGXCPU, 128 + signal.SIGKILL):
            return result("timeout", f"cpu time over {run.limits.cpu_s} s")
        if exit_code == 128 + signal.SIGXFSZ:
            return result("limit_exceeded", "limit:file_size")
        if exit_code is not None and exit_code > 128:
            return result("crash", f"signal {exit_code - 128}")
        return result("crash", f"exit {exit_code} without a valid report")
    if "load_error" in report:
        kind = report["load_error"]
        return result("limit_exceeded" if kind.startswith("limit:") else "crash", kind)
    outputs, errors = report["outputs"], report["errors"]
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


REPORT_MAX_BYTES = 64 * 1024      # a report is a few hundred bytes; more is not a report
_ERROR_MAX = 64                   # an error kind is "error:<exception class name>"


def parse_report(data: bytes | bytearray, n_tests: int) -> dict | None:
    """The harness's report (the last line of stdout), or None unless it has exactly the
    shape the harness writes. The program shares the harness's process, so the report is
    untrusted data: it decides nothing the program could not have computed, and no shape
    of it raises here."""
    lines = bytes(data).rstrip().rsplit(b"\n", 1)
    last = lines[-1]
    if not last or len(last) > REPORT_MAX_BYTES:
        return None
    try:
        report = json.loads(last)
    except (ValueError, RecursionError):
        return None
    if not isinstance(report, dict):
        return None
    if set(report) == {"load_error"}:
        return report if _is_error_kind(report["load_error"]) else None
    if set(report) != {"outputs", "errors"}:
        return None
    outputs, errors = report["outputs"], report["errors"]
    if not (isinstance(outputs, list) and isinstance(errors, list)
            and len(outputs) == len(errors) == n_tests):
        return None
    if not all(e is None or _is_error_kind(e) for e in errors):
        return None
    if not all(o is None or (type(o) is int and abs(o) < 2**53)
               or (type(o) is str and len(o) <= 64) for o in outputs):
        return None
    return report


def _is_error_kind(value) -> bool:
    return (type(value) is str and 0 < len(value) <= _ERROR_MAX
            and value.startswith(("error:", "limit:")))

