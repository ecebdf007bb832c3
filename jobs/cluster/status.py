"""What the Ray cluster has, and which runs hold what, for the cluster page.

    cluster_view()
        GET /nodes?view=summary      nodes: host, CPU %, memory, physical GPUs (Ray's agent
                                     reads them through NVML on each node)
        GET /api/cluster_status      logical resources per node: used / total
        GET /api/jobs/               Ray jobs; "rlplane-run-<id>" ones belong to runs
        GET /api/v0/actors           alive actors' resources, by job  (best effort)
        GET /api/v0/placement_groups reserved bundles, by job          (best effort)
        GET /nodes/<id>              per worker process: CPU and memory (a live run's actors)
    utilization()                    this host: NVML per GPU when pynvml imports and finds
                                     GPUs, and CPU per core

Every request goes through ``fetch_json`` (the one seam tests replace), with a short
timeout and the cluster's bearer token. A cluster that does not answer gives a view with
``error`` set, which the page shows instead of failing.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field

from django.conf import settings

from jobs.cluster.processes import RunProcess, cpu_per_core, run_processes
from jobs.cluster.ray import ray_auth_headers, run_id_of

TIMEOUT_S = 2.0
# Ray's bookkeeping resources ("node:<ip>", "node:__internal_head__") say nothing useful.
SHOWN_RESOURCES = ("CPU", "GPU", "memory", "objectStoreMemory", "object_store_memory")
LIVE_JOB = {"PENDING", "RUNNING"}


class ClusterUnreachable(Exception):
    pass


def fetch_json(path: str):
    """GET ``path`` from the Ray dashboard. Raises ClusterUnreachable with the reason."""
    url = settings.RAY_DASHBOARD_ADDRESS.rstrip("/") + path
    request = urllib.request.Request(url, headers=ray_auth_headers())
    # No proxy: the dashboard is on the cluster's network, never behind http_proxy.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=TIMEOUT_S) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        hint = " (check RAY_AUTH_TOKEN_PATH)" if exc.code in (401, 403) else ""
        raise ClusterUnreachable(f"{url} answered HTTP {exc.code}{hint}") from exc
    except (OSError, ValueError) as exc:
        raise ClusterUnreachable(f"{url}: {exc}") from exc


@dataclass
class Gpu:
    index: int
    name: str
    utilization_pct: float | None
    memory_used_mb: float | None
    memory_total_mb: float | None


@dataclass
class Resource:
    name: str
    used: float
    total: float


@dataclass
class RunJob:
    """A Ray job that belongs to an rlplane run, and what it holds."""
    run_id: int
    submission_id: str
    status: str
    node_id: str
    driver_pid: int | None
    job_id: str | None = None
    holds: dict[str, float] = field(default_factory=dict)
    processes: list[RunProcess] = field(default_factory=list)


@dataclass
class Node:
    node_id: str
    hostname: str
    ip: str
    is_head: bool
    state: str
    cpu_pct: float | None
    mem_pct: float | None
    resources: list[Resource]
    gpus: list[Gpu]
    runs: list[RunJob] = field(default_factory=list)


@dataclass
class ClusterView:
    address: str
    error: str = ""
    nodes: list[Node] = field(default_factory=list)
    runs: list[RunJob] = field(default_factory=list)
    other_jobs: int = 0

    @property
    def reachable(self) -> bool:
        return not self.error


def cluster_view() -> ClusterView:
    view = ClusterView(address=settings.RAY_DASHBOARD_ADDRESS)
    try:
        summary = fetch_json("/nodes?view=summary")["data"]["summary"]
        status = fetch_json("/api/cluster_status")["data"]["clusterStatus"]
        jobs = fetch_json("/api/jobs/")
    except ClusterUnreachable as exc:
        view.error = str(exc)
        return view
    usage = (status.get("loadMetricsReport") or {}).get("usageByNode") or {}
    view.nodes = [node_from_summary(entry, usage) for entry in summary]
    view.runs = [run_job(job) for job in jobs if is_run_job(job)]
    view.other_jobs = sum(1 for job in jobs if not is_run_job(job)
                          and job.get("status") in LIVE_JOB)
    actors, groups = live_state(view.runs)
    add_holdings(view.runs, actors, groups)
    add_processes(view, actors)
    by_node = {node.node_id: node for node in view.nodes}
    for run in view.runs:
        if run.status in LIVE_JOB and run.node_id in by_node:
            by_node[run.node_id].runs.append(run)
    return view


def node_from_summary(entry: dict, usage_by_node: dict) -> Node:
    raylet = entry.get("raylet") or {}
    node_id = raylet.get("nodeId", "")
    usage = usage_by_node.get(node_id) or {}
    totals = raylet.get("resourcesTotal") or {}
    resources = []
    for name in SHOWN_RESOURCES:
        if name in usage:
            used, total = usage[name]
            resources.append(Resource(name, used, total))
        elif name in totals:
            resources.append(Resource(name, 0.0, totals[name]))
    mem = entry.get("mem") or []
    return Node(
        node_id=node_id, hostname=entry.get("hostname", ""), ip=entry.get("ip", ""),
        is_head=bool(raylet.get("isHeadNode")), state=raylet.get("state", "?"),
        cpu_pct=entry.get("cpu"), mem_pct=mem[2] if len(mem) > 2 else None,
        resources=resources, gpus=[gpu_from_summary(g) for g in entry.get("gpus") or []])


def gpu_from_summary(gpu: dict) -> Gpu:
    return Gpu(index=gpu.get("index", 0), name=gpu.get("name", "GPU"),
               utilization_pct=gpu.get("utilizationGpu"),
               memory_used_mb=gpu.get("memoryUsed"), memory_total_mb=gpu.get("memoryTotal"))


def is_run_job(job: dict) -> bool:
    return run_id_of(job.get("submission_id") or "") is not None


def run_job(job: dict) -> RunJob:
    sid = job["submission_id"]
    holds = {}
    for key, name in (("entrypoint_num_cpus", "CPU"), ("entrypoint_num_gpus", "GPU")):
        if job.get(key):
            holds[name] = float(job[key])
    for name, amount in (job.get("entrypoint_resources") or {}).items():
        holds[name] = float(amount)
    return RunJob(run_id=run_id_of(sid), submission_id=sid,
                  status=job.get("status", "?"), node_id=job.get("driver_node_id") or "",
                  driver_pid=(job.get("driver_info") or {}).get("pid"),
                  job_id=job.get("job_id"), holds=holds)


def live_state(runs: list[RunJob]) -> tuple[list[dict], list[dict]]:
    """The state API's actors and placement groups while a run is live. Best effort: it
    may time out on a busy cluster, and the page is still useful without it."""
    if not any(run.status in LIVE_JOB for run in runs):
        return [], []
    try:
        return (state_rows("/api/v0/actors?detail=1&limit=10000"),
                state_rows("/api/v0/placement_groups?detail=1&limit=10000"))
    except ClusterUnreachable:
        return [], []


def add_processes(view: ClusterView, actors: list[dict]) -> None:
    """Each live run's processes (jobs.cluster.processes), CPU and memory from where they run."""
    hostnames = {node.node_id: node.hostname for node in view.nodes}
    details: dict[str, dict[int, dict]] = {}

    def worker_stats(node_id: str) -> dict[int, dict]:
        if node_id not in details:
            try:
                workers = fetch_json(f"/nodes/{node_id}")["data"]["detail"].get("workers")
            except (ClusterUnreachable, KeyError, TypeError):
                workers = []
            details[node_id] = {w.get("pid"): w for w in workers or []}
        return details[node_id]

    for run in view.runs:
        if run.status in LIVE_JOB:
            run.processes = run_processes(run.submission_id, run.job_id, actors,
                                          worker_stats, hostnames)


def add_holdings(runs: list[RunJob], actors: list[dict], groups: list[dict]) -> None:
    """Add what each live run's actors and placement groups hold."""
    job_ids = {run.job_id: run for run in runs if run.job_id and run.status in LIVE_JOB}
    held: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for group in groups:
        if group.get("state") == "CREATED" and group.get("creator_job_id") in job_ids:
            for bundle in group.get("bundles") or []:
                for name, amount in (bundle.get("unit_resources") or {}).items():
                    held[group["creator_job_id"]][name] += amount
    for actor in actors:
        if (actor.get("state") == "ALIVE" and actor.get("job_id") in job_ids
                and not actor.get("placement_group_id")):  # else counted with its group
            for name, amount in (actor.get("required_resources") or {}).items():
                held[actor["job_id"]][name] += amount
    for job_id, resources in held.items():
        run = job_ids[job_id]
        for name, amount in resources.items():
            run.holds[name] = run.holds.get(name, 0.0) + amount


def state_rows(path: str) -> list[dict]:
    return fetch_json(path)["data"]["result"]["result"]


@dataclass
class Utilization:
    """This host's devices: its GPUs through NVML where present, and its CPU per core."""
    label: str
    gpus: list[Gpu] = field(default_factory=list)
    cpu_per_core: list[float] = field(default_factory=list)


def utilization() -> Utilization:
    gpus = nvml_gpus()
    return Utilization(label="GPU (NVML) and CPU" if gpus else "CPU (no GPUs visible to NVML)",
                       gpus=gpus, cpu_per_core=cpu_per_core())


def nvml_gpus() -> list[Gpu]:
    """Per-GPU use through NVML, or [] when pynvml is not installed or finds no GPU."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            rates = pynvml.nvmlDeviceGetUtilizationRates(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(Gpu(index=index, name=name if isinstance(name, str) else name.decode(),
                            utilization_pct=float(rates.gpu),
                            memory_used_mb=memory.used / 2**20,
                            memory_total_mb=memory.total / 2**20))
        return gpus
    finally:
        pynvml.nvmlShutdown()
