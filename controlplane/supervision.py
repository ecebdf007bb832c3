"""Keep a set of child processes running: a child that exits is started again, after a
backoff, until it spends its restart budget; then the caller stops everything.

    watch()  every tick_s:
        a child exited ->  its session's leftovers stopped (a SIGKILLed `ray start` leaves
                           its GCS and raylet holding the ports)
                           budget.next_delay(now): None -> stop, with the reason
                                                   else -> restart due at now + delay
        a restart is due -> spawn the same argv, env and log (same port, same socket),
                           record it (pid file: the cluster page shows it), on_restart hook

Backoff doubles per restart still inside the budget's window (first_delay_s, 2x, 4x, ...
up to max_delay_s); more than ``budget`` restarts of one child within ``window_s`` means
it will not stay up, and the stack stops rather than spin.

No Django imports here (like processes.py): the supervisor runs before the database does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from controlplane import processes as proc
from controlplane.processes import ChildRecord, StackRecord

RESTARTS_KEPT = 50   # the pid file keeps this many of the latest restarts


@dataclass(frozen=True)
class RestartPolicy:
    budget: int = 5             # restarts of one child within window_s; one more stops all
    window_s: float = 600.0
    first_delay_s: float = 1.0  # doubled per restart inside the window
    max_delay_s: float = 30.0

    @classmethod
    def from_environment(cls, env=os.environ) -> RestartPolicy:
        """RLPLANE_RESTART_BUDGET, RLPLANE_RESTART_WINDOW_S, RLPLANE_RESTART_DELAY_S."""
        default = cls()

        def number(name: str, kind, fallback, low):
            raw = env.get(name, "")
            if not raw:
                return fallback
            try:
                value = kind(raw)
            except ValueError:
                value = None
            if value is None or value < low:
                what = "a whole number" if kind is int else "a number"
                raise proc.StartupError(f"{name}={raw!r}: expected {what} >= {low:g}")
            return value

        return cls(budget=number("RLPLANE_RESTART_BUDGET", int, default.budget, 0),
                   window_s=number("RLPLANE_RESTART_WINDOW_S", float, default.window_s, 1),
                   first_delay_s=number("RLPLANE_RESTART_DELAY_S", float,
                                        default.first_delay_s, 0))


class RestartBudget:
    """One child's restarts within the policy's sliding window."""

    def __init__(self, policy: RestartPolicy):
        self.policy = policy
        self.times: deque[float] = deque()

    def next_delay(self, now: float) -> float | None:
        """Count an exit at ``now``: the backoff before its restart, or None when the
        budget is spent (``budget`` restarts already within the window)."""
        p = self.policy
        while self.times and self.times[0] <= now - p.window_s:
            self.times.popleft()
        if len(self.times) >= p.budget:
            return None
        delay = min(p.first_delay_s * 2 ** len(self.times), p.max_delay_s)
        self.times.append(now)
        return delay


@dataclass
class Child:
    name: str
    argv: list[str]
    env: dict[str, str]
    popen: subprocess.Popen
    budget: RestartBudget
    restarts: int = 0
    due: float | None = None       # monotonic time of a pending restart
    exit_note: dict = field(default_factory=dict)


def exit_text(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exited with code {code}"


class ChildSupervisor:
    """Spawns children (setsid, one log each), restarts them, and keeps ``record`` (the
    stack's pid file) up to date. ``on_restart[name](note)`` runs after a child was
    started again; ``note`` is the restart's entry in ``record.restarts``."""

    tick_s = 0.5
    reaps_orphans = False   # set where this process is a subreaper (proc.become_subreaper)

    def __init__(self, log_dir: Path, pid_file: Path, record: StackRecord,
                 policy: RestartPolicy, cwd: Path | None = None, grace_s: float = 5.0):
        self.log_dir, self.pid_file, self.record = log_dir, pid_file, record
        self.policy, self.cwd, self.grace_s = policy, cwd, grace_s
        self.children: dict[str, Child] = {}
        self.on_restart: dict[str, Callable[[dict], None]] = {}

    def log(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def save_record(self) -> None:
        proc.write_pid_file(self.pid_file, self.record)

    def spawn(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        with open(self.log(name), "ab") as log:
            popen = subprocess.Popen(
                argv, cwd=self.cwd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        if name in self.children:
            self.children[name].popen = popen
        else:
            self.children[name] = Child(name, argv, env, popen, RestartBudget(self.policy))
        self.record.children = [c for c in self.record.children if c.name != name]
        self.record.children.append(
            ChildRecord(name=name, pid=popen.pid, create_time=proc.create_time(popen.pid)))
        self.save_record()
        return popen

    # -- one tick -------------------------------------------------------------------------

    def check(self, now: float | None = None) -> str | None:
        """Notice exits and start what is due. Returns why the stack must stop (a budget
        spent), else None."""
        now = time.monotonic() if now is None else now
        for child in self.children.values():
            if child.due is None and child.popen.poll() is not None:
                if reason := self.exited(child, now):
                    return reason
        for child in self.children.values():
            if child.due is not None and now >= child.due:
                self.restart(child)
        if self.reaps_orphans:
            self.reap_orphans()
        return None

    def reap_orphans(self) -> None:
        """Reap what exited and is not a child we watch (as a subreaper, orphans of our
        children): waitpid(-1) would also reap a watched child and lose its exit code."""
        watched = {c.popen.pid: c.popen for c in self.children.values()}
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None or info.si_pid == 0:
                return
            if info.si_pid in watched:
                watched.pop(info.si_pid).poll()   # keeps its exit code for the next check
            else:
                os.waitpid(info.si_pid, 0)

    def exited(self, child: Child, now: float) -> str | None:
        code = child.popen.returncode
        # What it started in its session (a Celery pool, Ray's GCS and raylet) goes with it,
        # else the new one finds its port taken.
        if leftovers := proc.session_members(child.popen.pid):
            proc.terminate(leftovers, self.grace_s)
        delay = child.budget.next_delay(now)
        p = self.policy
        if delay is None:
            return (f"{child.name} {exit_text(code)} and was restarted {p.budget} times "
                    f"within {p.window_s:g} s (its restart budget); last lines of "
                    f"{self.log(child.name)}:\n{proc.log_tail(self.log(child.name))}")
        child.due = now + delay
        child.exit_note = {"child": child.name, "pid": child.popen.pid,
                           "exit": exit_text(code), "died_at": utc_now(),
                           "delay_s": delay, "in_window": len(child.budget.times),
                           "budget": p.budget, "window_s": p.window_s}
        say(f"{child.name} (pid {child.popen.pid}) {exit_text(code)}; restarting it in "
            f"{delay:g} s (restart {len(child.budget.times)} of {p.budget} within "
            f"{p.window_s:g} s)")
        return None

    def restart(self, child: Child) -> None:
        child.due = None
        with open(self.log(child.name), "a") as log:   # where the new one's lines start
            log.write(f"\n--- rlplane: {child.name} (pid {child.exit_note['pid']}) "
                      f"{child.exit_note['exit']} at {child.exit_note['died_at']}; restarted "
                      f"after {child.exit_note['delay_s']:g} s ---\n")
        popen = self.spawn(child.name, child.argv, child.env)
        child.restarts += 1
        note = {**child.exit_note, "new_pid": popen.pid, "restarted_at": utc_now()}
        self.record.restarts = [*self.record.restarts, note][-RESTARTS_KEPT:]
        self.save_record()
        say(f"{child.name} restarted (pid {popen.pid}); log {self.log(child.name)}")
        if hook := self.on_restart.get(child.name):
            try:
                hook(note)
            except (proc.StartupError, OSError) as exc:   # reported; the stack goes on
                say(f"after restarting {child.name}: {exc}")

    def watch(self) -> int:
        """Until a budget is spent (1) or a signal unwinds the caller."""
        while True:
            if reason := self.check():
                print(f"rlplane: stopping the stack: {reason}", file=sys.stderr, flush=True)
                self.record.stopped_because = reason.splitlines()[0]
                self.save_record()
                return 1
            time.sleep(self.tick_s)


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def say(message: str) -> None:
    print(f"rlplane: {message}", flush=True)
