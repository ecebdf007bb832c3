"""The embedded stack's own processes, for the cluster page: which are up, and every
restart its supervisor made (controlplane/supervision.py), read from the stack's pid file.

Every process the stack starts carries RLPLANE_STACK_DIR (controlplane.processes'
marker); a control plane started any other way has none, and the page shows no panel.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from controlplane import processes as proc


@dataclass
class StackChild:
    name: str
    pid: int
    alive: bool
    restarts: int


@dataclass
class StackView:
    supervised: bool = True   # its supervisor is alive (else nothing restarts a dead child)
    children: list[StackChild] = field(default_factory=list)
    restarts: list[dict] = field(default_factory=list)   # newest first


def stack_view(environ=os.environ) -> StackView | None:
    """None when this process was not started by the embedded stack, or its record is gone."""
    stack_dir = environ.get(proc.STACK_MARKER)
    if not stack_dir:
        return None
    record = proc.read_pid_file(Path(stack_dir) / "stack.json")
    if record is None:
        return None
    counts: dict[str, int] = {}
    for note in record.restarts:
        counts[note.get("child", "")] = counts.get(note.get("child", ""), 0) + 1
    return StackView(
        supervised=proc.is_alive(record.supervisor_pid, record.supervisor_create_time),
        children=[StackChild(c.name, c.pid, proc.is_alive(c.pid, c.create_time),
                             counts.get(c.name, 0)) for c in record.children],
        restarts=list(reversed(record.restarts)))
