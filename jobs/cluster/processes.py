"""Each live run's processes, wherever they run, with their CPU and memory.

    entrypoint  the Ray job's entrypoint (python -m engine.ray_job) and what it starts (a
                vLLM engine core, sandboxed programs): the descendants of the job's
                supervisor actor, measured here with psutil when it runs on this host
    actors      the run's Ray actors (learner, rollout workers, reward pool, reward model):
                pid and node from Ray's state API; CPU and memory from Ray's agent on
                their node (GET /nodes/<id>: every worker process's cpu_percent and rss)

A run in the in-process placement is all entrypoint; a Ray placement is mostly actors.
psutil's cpu_percent is a rate since its previous call on the same Process object, so the
objects are kept between page polls; a process seen for the first time is sampled over
one short window (all of them together), so no figure reads a meaningless 0.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

import psutil

SAMPLE_S = 0.1
SUPERVISOR = "_ray_internal_job_actor_{}"   # Ray Jobs' JOB_ACTOR_NAME_TEMPLATE

_seen: dict[tuple[int, float], psutil.Process] = {}   # (pid, create time) -> process
_cores_primed: set[int] = set()   # threads whose previous per-core sample psutil holds


@dataclass
class RunProcess:
    role: str                 # "entrypoint", "entrypoint child" or the actor's class
    pid: int
    host: str
    cpu_pct: float | None     # of one core; None where nobody measured it
    rss_mb: float | None


def cpu_per_core() -> list[float]:
    """This host's CPU per core, since this thread's previous call; a thread's first call
    samples a short window. psutil keeps the previous sample per thread, and the web
    server renders pages on a pool of threads: a process-wide "primed" flag let a fresh
    thread's first call measure a zero-length window, read as 0 % on a saturated box."""
    thread = threading.get_ident()
    interval = None if thread in _cores_primed else SAMPLE_S
    _cores_primed.add(thread)
    return psutil.cpu_percent(interval=interval, percpu=True)


def local_family(pid: int) -> list[tuple[str, float | None, float | None, int]]:
    """(role, cpu %, rss MiB, pid) of the descendants of ``pid`` on this host."""
    try:
        children = psutil.Process(pid).children(recursive=True)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []
    fresh = []
    family = []
    for child in children:
        try:
            key = (child.pid, child.create_time())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if key not in _seen:
            _seen[key] = child
            fresh.append(child)
        family.append((key, _seen[key]))
    for process in fresh:                 # starts each new process's sample window
        _try(process.cpu_percent)
    if fresh:
        time.sleep(SAMPLE_S)
    alive = {key for key, _ in family}
    for key in [k for k in _seen if k not in alive and not psutil.pid_exists(k[0])]:
        del _seen[key]
    out = []
    for i, (key, process) in enumerate(family):
        cpu = _try(process.cpu_percent)
        memory = _try(process.memory_info)
        out.append(("entrypoint" if i == 0 else "entrypoint child", cpu,
                    memory.rss / 2**20 if memory else None, key[0]))
    return out


def _try(fn):
    try:
        return fn()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def run_processes(submission_id: str, job_id: str | None, actors: list[dict],
                  worker_stats, hostnames: dict[str, str]) -> list[RunProcess]:
    """``actors``: the state API's actor rows; ``worker_stats(node_id)`` -> {pid: row of
    GET /nodes/<id> "workers"}; ``hostnames``: node id -> hostname."""
    out: list[RunProcess] = []
    here = socket.gethostname()
    supervisor = next((a for a in actors if a.get("state") == "ALIVE"
                       and a.get("name") == SUPERVISOR.format(submission_id)), None)
    if supervisor is not None and supervisor.get("pid"):
        host = hostnames.get(supervisor.get("node_id", ""), "")
        if host in ("", here):
            out += [RunProcess(role, pid, here, cpu, rss)
                    for role, cpu, rss, pid in local_family(supervisor["pid"])]
        else:
            out.append(RunProcess("entrypoint (on another host: not measured here)",
                                  supervisor["pid"], host, None, None))
    for actor in actors:
        if actor.get("state") != "ALIVE" or not job_id or actor.get("job_id") != job_id:
            continue
        node = actor.get("node_id", "")
        stats = worker_stats(node).get(actor.get("pid")) or {}
        memory = stats.get("memory_info") or stats.get("memoryInfo") or {}
        out.append(RunProcess(
            actor.get("class_name") or "actor", actor.get("pid") or 0,
            hostnames.get(node, node[:12]),
            stats.get("cpu_percent", stats.get("cpuPercent")),
            memory["rss"] / 2**20 if memory.get("rss") is not None else None))
    return out
