"""The run directory's marker: proof, for a driver on another node, that the directory it
was given is the one the control plane made, on storage both of them reach.

    control plane (before submitting)          driver (python -m engine.ray_job, at start)
    mark_run_dir(DIR, key) -> DIR/MARKER       check_run_dir(DIR, key): MARKER holds key,
                                               or RunDirError, before anything is written

Checkpoints, the event log and the ingest spool live in the run directory; the control
plane lists, forks from and reconciles what it finds there. A driver whose node has no
shared mount at the control plane's RLPLANE_RUNS_DIR would write them to a local disk of
its own, where no fork or resume finds them: it refuses to start instead. The key names
the run (its id and creation time), so a stale directory of an older run with the same id
on a node's local disk does not pass. The key is the same for every submission of a run
(a retry, a restart, a racing twin), so writing it again never breaks a running driver.

Standard library only: the web process writes it, the driver reads it.
"""

from __future__ import annotations

import os
from pathlib import Path

MARKER = ".rlplane-run-dir"


class RunDirError(RuntimeError):
    """The run directory is not the control plane's: the message says why and the fix."""


def mark_run_dir(run_dir: Path, key: str) -> Path:
    """Create ``run_dir`` and write ``key`` into its marker (atomically: a driver never
    reads half of it). Returns the marker's path."""
    run_dir.mkdir(parents=True, exist_ok=True)
    marker = run_dir / MARKER
    tmp = marker.with_name(f"{MARKER}.{os.getpid()}.tmp")
    tmp.write_text(key)
    tmp.replace(marker)
    return marker


def check_run_dir(run_dir: Path, key: str) -> None:
    """Raise RunDirError unless ``run_dir``'s marker holds ``key``."""
    marker = run_dir / MARKER
    try:
        found = marker.read_text()
    except FileNotFoundError:
        found = None
    if found == key:
        return
    seen = ("has no marker" if found is None
            else f"holds the marker of another run ({found!r}, expected {key!r})")
    raise RunDirError(
        f"the run directory {run_dir} {seen} on this node ({os.uname().nodename}): this "
        f"node does not see the control plane's RLPLANE_RUNS_DIR ({run_dir.parent}). Mount "
        "the same shared storage at that path on every Ray node and on the control plane's "
        "host (deploy/README.md, 'Run directories'); checkpoints written to a local disk "
        "would be lost to fork and resume")
