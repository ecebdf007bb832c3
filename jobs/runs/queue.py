"""The capacity-aware queue: a queued run starts when the cluster can hold its placement.

    do_schedule_runs()        on launch/fork/priority commit, on a run's end, every beat
        free = capacity - taken
        for each queued run, priority (high first), then FIFO:
            fits  -> queued -> submitting, its demand taken from free; submit_run on commit
            else  -> stays queued; status_reason "waits for 2 GPUs; 0 of 4 free"

What a run asks for (``run_demand``):
    a Ray placement  its placement bundles, summed (engine.api.placement_demand): {GPU: 4};
                     a live run resized (set_rollout_workers) holds its launch bundles and
                     one per rollout worker beyond the launch's (Run.rollout_workers)
    every rlplane driver  RLPLANE_DRIVER_RESOURCES on top (its Ray job's entrypoint
                     resources: the nodes that may hold a driver)
    a launched external run  its command's CPUs and GPUs (the Ray job's entrypoint)
    an external run reporting from elsewhere  nothing
    in process       one run slot; RLPLANE_MAX_LOCAL_RUNS of them (the default colocated
                     placement runs inside its Ray job's driver and reserves nothing on Ray,
                     but every such run shares the control plane host's CPUs)

What is taken: what live runs' placements ask for, or what Ray reports in use, whichever
is more (a run just admitted counts before its placement group exists; a job that is not
an rlplane run counts too). Capacity of Ray resources is Ray's total
(GET /api/cluster_status), asked only when a queued run needs Ray resources.

A queued run whose stored config no longer validates (an upgrade changed a field, the row
was edited) is failed with the validation message, and the queue goes on behind it: one
row nobody can read must not stop every run from starting. A live run whose config no
longer reads counts nothing of its own (Ray's reported use still counts what it holds).

A run that does not fit does not hold back smaller runs behind it (first fit, in order):
a run asking for more than the cluster has can wait for a bigger cluster without blocking
everyone. Two schedulers never admit into the same free space: each holds the queued and
live rows' locks (on SQLite, the IMMEDIATE transaction's write lock) while it decides.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from functools import partial

from django.conf import settings
from django.db import transaction

from engine.api import placement_demand
from engine.config import ConfigError, RunConfig
from jobs.cluster.status import ClusterUnreachable, fetch_json
from jobs.models import LIVE, InvalidTransition, Run, RunStatus
from jobs.runs.submit import submit_run

logger = logging.getLogger(__name__)

RUN_SLOT = "run slot"  # not a Ray resource: the in-process runs' share of this host
Resources = dict[str, float]


def demand_of(cfg: RunConfig, rollout_workers: int | None = None) -> Resources:
    """The run's placement (or a run slot) and its driver's RLPLANE_DRIVER_RESOURCES,
    which the Ray job reserves as its entrypoint's resources: counted here, a run waits
    in the queue saying so instead of PENDING inside Ray."""
    demand = dict(placement_demand(cfg, rollout_workers) or {RUN_SLOT: 1.0})
    for name, amount in settings.RLPLANE_DRIVER_RESOURCES.items():
        demand[name] = demand.get(name, 0.0) + float(amount)
    return demand


def run_demand(run: Run) -> Resources:
    """What ``run`` asks for: its placement's (with the rollout workers of its latest live
    resize), or for an external run its launch command's CPUs and GPUs (reserved for the
    Ray job's entrypoint); an external run that reports from its own process takes
    nothing here."""
    if not run.is_external:
        return demand_of(run.run_config, run.rollout_workers)
    launch = run.external_config.launch
    if launch is None:
        return {}
    return {name: float(amount) for name, amount in (("CPU", launch.cpus),
                                                     ("GPU", launch.gpus)) if amount}


def unreadable(run: Run) -> ConfigError | None:
    """Why ``run``'s stored config cannot be read any more, or None when it can."""
    try:
        run_demand(run)
    except ConfigError as exc:
        return exc
    return None


def do_fail_unreadable(runs: list[Run]) -> list[Run]:
    """Fail each queued run in ``runs`` whose stored config no longer validates, with the
    validation message as its reason; returns the others."""
    readable = []
    for run in runs:
        exc = unreadable(run)
        if exc is None:
            readable.append(run)
            continue
        problems = "; ".join(f"{path}: {message}" for path, message in exc.errors)
        logger.warning("queue: run %s failed, its stored config does not validate: %s",
                       run.pk, problems)
        try:
            run.transition_to(RunStatus.FAILED, "its stored config no longer validates, so "
                              f"the queue cannot place it: {problems}"[:2000])
        except InvalidTransition:
            pass  # another writer moved it on: no longer queued either way
    return readable


def ray_capacity() -> tuple[Resources, Resources]:
    """Ray's (total, used) per resource, cluster-wide. Raises ClusterUnreachable, also
    while a fresh head has not reported its resources yet (its first seconds)."""
    status = fetch_json("/api/cluster_status")["data"]["clusterStatus"]
    usage = (status.get("loadMetricsReport") or {}).get("usage") or {}
    if not usage:
        raise ClusterUnreachable("the Ray cluster has not reported its resources yet")
    # The dashboard spells resource names in camelCase ("rlplane_driver" reads
    # "rlplaneDriver"): the driver resources are named back as settings spell them.
    named = {_camel(name): name for name in settings.RLPLANE_DRIVER_RESOURCES}
    total = {named.get(name, name): float(of) for name, (_, of) in usage.items()}
    used = {named.get(name, name): float(in_use) for name, (in_use, _) in usage.items()}
    return total, used


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def plural(name: str, amount: float) -> str:
    return name if amount == 1 else f"{name}s"


def wait_reason(asked: Resources, free: Resources, total: Resources) -> str:
    """"waits for 2 GPUs; 0 of 4 free", for each resource that is short."""
    return "; ".join(f"waits for {asked[name]:g} {plural(name, asked[name])}; "
                     f"{max(free.get(name, 0.0), 0.0):g} of {total.get(name, 0.0):g} free"
                     for name in sorted(asked) if asked[name] > free.get(name, 0.0))


def capacity(needs_ray: bool) -> tuple[Resources, Resources, str]:
    """(total, Ray's used, why Ray did not answer ("" when it did)); Ray is asked only
    when ``needs_ray``."""
    total: Resources = {RUN_SLOT: float(settings.RLPLANE_MAX_LOCAL_RUNS)}
    if not needs_ray:
        return total, {}, ""
    try:
        ray_total, ray_used = ray_capacity()
    except ClusterUnreachable as exc:
        return total, {}, str(exc)
    return {**total, **ray_total}, ray_used, ""


def free_of(total: Resources, ray_used: Resources, live: list[Run]) -> Resources:
    """What is free: the total less what live runs' placements ask for or what Ray
    reports in use, whichever is more."""
    taken: Resources = defaultdict(float)
    for run in live:
        if unreadable(run) is not None:
            continue
        for name, amount in run_demand(run).items():
            taken[name] += amount
    return {name: amount - max(taken.get(name, 0.0), ray_used.get(name, 0.0))
            for name, amount in total.items()}


def never_fits(asked: Resources) -> str | None:
    """Why no state of the cluster could ever hold ``asked``, asking Ray (never_reason);
    None when it could, and when Ray does not answer (then the run waits in the queue,
    saying why)."""
    if not set(asked) - {RUN_SLOT}:
        return None
    total, _, ray_error = capacity(True)
    return None if ray_error else never_reason(asked, total)


def never_reason(asked: Resources, total: Resources) -> str | None:
    """Why ``asked`` could never fit in ``total``: more of a Ray resource than all the
    cluster's nodes have together (2 GPUs on a CPU-only cluster). A launch is refused with
    it rather than queued forever."""
    short = short_of(asked, total)
    if not short:
        return None
    missing = "; ".join(f"it asks for {asked[name]:g} {plural(name, asked[name])} and the "
                        f"Ray cluster has {total.get(name, 0.0):g} in all" for name in short)
    driver = [n for n in short if n in settings.RLPLANE_DRIVER_RESOURCES]
    fix = ("Ask for fewer (placement.rollout_workers, devices_per_worker, learner_devices) "
           "or add nodes that have them")
    if driver:
        fix += (f"; {', '.join(driver)} is what every run's driver reserves "
                f"(RLPLANE_DRIVER_RESOURCES): start a Ray node with it (ray start "
                f"--resources) or change that setting")
    return f"no node set of the cluster could ever hold this placement: {missing}. {fix}"


def short_of(asked: Resources, total: Resources) -> list[str]:
    """The Ray resources ``asked`` holds more of than all the cluster's nodes together."""
    return [name for name in sorted(asked)
            if name != RUN_SLOT and asked[name] > total.get(name, 0.0)]


def resize_refusal(run: Run, workers: int) -> str | None:
    """Why no state of the cluster could hold ``run`` with ``workers`` rollout workers (a
    set_rollout_workers control); None when it could, and when Ray does not answer (the
    engine then refuses what it cannot place, and the run goes on)."""
    asked = placement_demand(run.run_config, workers)
    if not asked:
        return None
    total, _, ray_error = capacity(True)
    short = [] if ray_error else short_of(asked, total)
    if not short:
        return None
    return "; ".join(f"{workers} rollout workers with the rest of this run's placement ask "
                     f"for {asked[name]:g} {plural(name, asked[name])} and the Ray cluster "
                     f"has {total.get(name, 0.0):g} in all" for name in short) + \
        "; ask for fewer"


def fits_now(asked: Resources) -> tuple[bool | None, str]:
    """Could the cluster hold ``asked`` now, and the sentence that says so: (True, "2 of 4
    GPUs free"), (False, "waits for ..."), or (None, why Ray did not answer). Reads without
    locking: a preview, not an admission (queued runs ahead of it may take the space)."""
    total, ray_used, ray_error = capacity(bool(set(asked) - {RUN_SLOT}))
    if ray_error:
        return None, f"the Ray cluster did not answer: {ray_error}"
    live = Run.objects.filter(status__in=LIVE).only("config", "rollout_workers")
    free = free_of(total, ray_used, list(live))
    if all(amount <= free.get(name, 0.0) for name, amount in asked.items()):
        return True, ", ".join(
            f"{max(free.get(name, 0.0), 0.0):g} of {total.get(name, 0.0):g} "
            f"{plural(name, total.get(name, 0.0))} free" for name in sorted(asked))
    return False, never_reason(asked, total) or wait_reason(asked, free, total)


def do_schedule_runs() -> list[int]:
    """Admit the queued runs that fit, in priority then FIFO order; record why the others
    wait. Returns the admitted run ids (their submit_run is queued on commit)."""
    waiting = do_fail_unreadable(list(Run.objects.filter(status=RunStatus.QUEUED)))
    if not waiting:
        return []
    total, ray_used, ray_error = capacity(
        any(set(run_demand(run)) - {RUN_SLOT} for run in waiting))
    admitted: list[int] = []
    with transaction.atomic():
        rows = list(Run.objects.select_for_update()
                    .filter(status__in=[RunStatus.QUEUED, *LIVE]).order_by("pk"))
        free = free_of(total, ray_used, [r for r in rows if r.status != RunStatus.QUEUED])
        queued = sorted(do_fail_unreadable([r for r in rows if r.status == RunStatus.QUEUED]),
                        key=lambda r: (-r.priority, r.created_at, r.pk))
        for run in queued:
            asked = run_demand(run)
            if ray_error and set(asked) - {RUN_SLOT}:
                reason = f"waits for the Ray cluster to answer: {ray_error}"
            elif all(amount <= free.get(name, 0.0) for name, amount in asked.items()):
                for name, amount in asked.items():
                    free[name] -= amount
                run.transition_to(RunStatus.SUBMITTING, "admitted by the queue")
                admitted.append(run.pk)
                continue
            else:
                reason = wait_reason(asked, free, total)
            if reason != run.status_reason:
                Run.objects.filter(pk=run.pk, status=RunStatus.QUEUED) \
                    .update(status_reason=reason)
        for run_id in admitted:
            transaction.on_commit(partial(submit_run.delay, run_id))
    if admitted:
        logger.info("queue: admitted runs %s", admitted)
    return admitted


def schedule_on_commit() -> None:
    """Run the queue once the caller's transaction commits. Robust: the launch (or the
    status change) stands even if scheduling fails; the beat's next pass retries."""
    transaction.on_commit(do_schedule_runs, robust=True)
