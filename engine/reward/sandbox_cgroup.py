"""One cgroup per sandbox: the whole program tree's memory and process count.

    v2  <the worker's cgroup>/rlplane-sandbox-<uid>/  memory.max, memory.swap.max=0, pids.max
        where the worker's cgroup offers the memory and pids controllers (a delegated one)
    v1  memory/<worker's>/rlplane-sandbox-<uid>/memory.limit_in_bytes (+ memsw) and
        pids/<worker's>/rlplane-sandbox-<uid>/pids.max, where those hierarchies are writable
    none  a degraded note (``degraded_reason()``, in every SandboxResult and logged once);
        the parent then sums the tree's PSS every 20 ms and kills it over memory_mb
        (sandbox._tree_pss): coarser than memory.max, and pids only by RLIMIT_NPROC

The launcher writes 0 into each ``cgroup.procs`` before it execs bwrap, so every process
of the sandbox is born inside. ``oom_kills()`` tells the judge that the kernel killed a
process for memory (the program sees a SIGKILL).
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from pathlib import Path

MB = 2**20


@dataclass
class Cgroup:
    kind: str                       # "v2" | "v1"
    dirs: list[Path]                # one per hierarchy (v1: memory, pids)

    def oom_kills(self) -> int:
        events = self.dirs[0] / ("memory.events" if self.kind == "v2" else "memory.oom_control")
        try:
            lines = events.read_text().splitlines()
        except OSError:
            return 0
        return sum(int(li.split()[1]) for li in lines if li.startswith("oom_kill "))

    def remove(self) -> None:
        """rmdir once the tree is gone (the kernel frees a dying cgroup a moment later)."""
        for d in self.dirs:
            for _ in range(200):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.005)


def create(name: str, memory_mb: int, max_processes: int) -> Cgroup | None:
    """A fresh cgroup holding at most ``memory_mb`` and ``max_processes``; None when this
    machine offers no writable one (see ``degraded_reason``)."""
    found, parents = _hierarchies()
    if found == "none":
        return None
    dirs = [p / name for p in parents]
    for d in dirs:
        d.mkdir(exist_ok=True)
    limit = str(memory_mb * MB)
    if found == "v2":
        _write(dirs[0] / "memory.max", limit)
        _write(dirs[0] / "memory.swap.max", "0", optional=True)
        _write(dirs[0] / "pids.max", str(max_processes))
    else:
        _write(dirs[0] / "memory.limit_in_bytes", limit)
        _write(dirs[0] / "memory.memsw.limit_in_bytes", limit, optional=True)
        _write(dirs[1] / "pids.max", str(max_processes))
    return Cgroup(found, dirs)


def kind() -> str:
    """ "v2", "v1" or "none": which cgroups sandboxes get on this machine."""
    return _hierarchies()[0]


def degraded_reason() -> str | None:
    """None when each sandbox gets a cgroup; else why not, and what bounds memory instead."""
    found, why = _hierarchies()
    if found != "none":
        return None
    return (f"no per-sandbox cgroup ({why}): the tree's total memory is polled (every "
            "20 ms) instead of enforced by the kernel; give the reward workers a delegated "
            "cgroup v2 with the memory and pids controllers")


def _write(path: Path, value: str, optional: bool = False) -> None:
    try:
        path.write_text(value)
    except (FileNotFoundError, PermissionError):
        if not optional:
            raise


@functools.cache
def _hierarchies():
    """("v2", [parent]) | ("v1", [memory parent, pids parent]) | ("none", reason)."""
    mounts = _cgroup_mounts()
    own = _own_cgroups()
    v2 = mounts.get("cgroup2")
    if v2 is not None and "" in own:
        parent = _join(v2, own[""])
        if _usable(parent) and {"memory", "pids"} <= set(
                (parent / "cgroup.controllers").read_text().split()):
            _write(parent / "cgroup.subtree_control", "+memory +pids", optional=True)
            if {"memory", "pids"} <= set((parent / "cgroup.subtree_control").read_text().split()):
                return "v2", [parent]
    if "memory" in mounts and "pids" in mounts and "memory" in own and "pids" in own:
        parents = [_join(mounts[c], own[c]) for c in ("memory", "pids")]
        if all(_usable(p) for p in parents):
            return "v1", parents
    if v2 is None and "memory" not in mounts:
        return "none", "no cgroup filesystem is mounted"
    return "none", "the memory and pids controllers are not writable for this user"


def _usable(parent: Path) -> bool:
    return parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)


def _join(mount: tuple[Path, str], path: str) -> Path:
    mountpoint, root = mount
    rel = path[len(root):] if root != "/" and path.startswith(root) else path
    return mountpoint / rel.lstrip("/")


def _cgroup_mounts() -> dict[str, tuple[Path, str]]:
    """{"cgroup2" | v1 controller: (mount point, root inside the hierarchy)}."""
    found: dict[str, tuple[Path, str]] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        where = (Path(fields[4]), fields[3])
        if tail[0] == "cgroup2":
            found.setdefault("cgroup2", where)
        elif tail[0] == "cgroup":
            for opt in tail[2].split(","):
                if opt in ("memory", "pids"):
                    found.setdefault(opt, where)
    return found


def _own_cgroups() -> dict[str, str]:
    """{"" (v2) | v1 controller: this process's cgroup path}."""
    own: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            own[c] = path
    return own
