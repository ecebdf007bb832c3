"""One way to call a worker, wherever it runs: by the method itself, not its name.

    h = LocalActor(RolloutWorker(...))                       # in this process: runs at once
    h = ThreadActor(RolloutWorker(...), threads=1)           # in this process, on a thread
                                                             # of its own (torch threads: 1)
    h = RayActor.start(RolloutWorker, args, gpus, pg, bundle)  # on its placement bundle
    f = h.call(RolloutWorker.produce, step, problems, seed)  # -> Future; in submit order
    f.result();  wait_any([f, g])                            # first finished futures
    ticket = h.call(LearnerWorker.prepare, step, False)
    w.call(RolloutWorker.receive_weights, ticket, step)      # a future passes as a ref

Naming the method object makes a rename fail at import (and in the type checker) instead
of at run time. Dispatch is by the method's name on the actor, so a class that provides
the same method (a test's worker) is called the same way. A Ray actor runs its calls one
at a time, in order, except methods marked ``@concurrent(group)``, which run in that
concurrency group (the driver reads a worker's running spans while it generates).

An actor that dies (its process killed, its node gone) fails its calls with ActorLost,
whose ``cause`` says why in one line, and so does one that does not answer within
``result(timeout_s)``: the loop replaces a lost rollout worker
(engine.orchestration.replacement); a lost learner fails the run.
"""

from __future__ import annotations

import concurrent.futures as cf
import inspect
import os
import sys
import threading
from collections.abc import Callable
from typing import Any


def concurrent(group: str) -> Callable[[Callable], Callable]:
    """Mark an actor method to run in its own Ray concurrency group (one thread)."""
    def mark(fn: Callable) -> Callable:
        fn.concurrency_group = group
        return fn
    return mark


def concurrency_groups(cls: type) -> dict[str, int]:
    return {fn.concurrency_group: 1 for _, fn in inspect.getmembers(cls, inspect.isfunction)
            if hasattr(fn, "concurrency_group")}


class ActorLost(RuntimeError):
    """A call's actor died before it answered (Ray's RayActorError, said in one line)."""

    def __init__(self, cause: str):
        super().__init__(cause)
        self.cause = cause


RAY_DEATH_PREAMBLE = "The actor died unexpectedly before finishing this task."
RAY_ADVICE = (" Some common causes", " There are some potential root causes")


def death_cause(error_msg: str) -> str:
    """Ray's account of an actor's death in one line: its untabbed lines (what died and
    why; the tabbed ones are ids and addresses) without the preamble every death shares
    or the generic advice after them, cut at 300 characters."""
    text = " ".join(line.strip() for line in error_msg.splitlines()
                    if line.strip() and not line.startswith("\t"))
    text = text.removeprefix(RAY_DEATH_PREAMBLE).strip() or RAY_DEATH_PREAMBLE
    for advice in RAY_ADVICE:
        text = text.split(advice)[0]
    return text if len(text) <= 300 else text[:297] + "..."


class Done:
    """A value computed in this process."""

    def __init__(self, value: Any):
        self.value = value

    def result(self, timeout_s: float | None = None) -> Any:
        return self.value

    def done(self, timeout_s: float = 0) -> bool:
        return True


class RayFuture:
    def __init__(self, ref):
        self.ref = ref

    def result(self, timeout_s: float | None = None) -> Any:
        import ray

        try:
            return ray.get(self.ref, timeout=timeout_s)
        except ray.exceptions.RayActorError as exc:
            raise ActorLost(death_cause(str(exc))) from exc
        except ray.exceptions.GetTimeoutError as exc:
            raise ActorLost(f"it did not answer within {timeout_s:g} s") from exc

    def done(self, timeout_s: float = 0) -> bool:
        """Whether it answered (or failed), waiting up to ``timeout_s`` for it."""
        import ray

        return bool(ray.wait([self.ref], timeout=timeout_s)[0])


class ThreadFuture:
    """A call queued on a ThreadActor's thread."""

    def __init__(self, future: cf.Future):
        self.future = future

    def result(self, timeout_s: float | None = None) -> Any:
        try:
            return self.future.result(timeout_s)
        except cf.TimeoutError as exc:
            raise ActorLost(f"it did not answer within {timeout_s:g} s") from exc

    def done(self, timeout_s: float = 0) -> bool:
        cf.wait([self.future], timeout=timeout_s)
        return self.future.done()


def wait_any(futures: list) -> list:
    """The futures among ``futures`` that are done, waiting for at least one."""
    done = [f for f in futures if isinstance(f, Done)]
    if done:
        return done
    threaded = [f for f in futures if isinstance(f, ThreadFuture)]
    if threaded:                      # one kind per run: a run is in process or on Ray
        ready, _ = cf.wait([f.future for f in threaded],
                                           return_when=cf.FIRST_COMPLETED)
        return [f for f in threaded if f.future in ready]
    import ray

    ready, _ = ray.wait([f.ref for f in futures], num_returns=1)
    return [f for f in futures if f.ref in ready]


def _arg(a: Any) -> Any:
    if isinstance(a, ThreadFuture):
        return a.result()
    return a.ref if isinstance(a, RayFuture) else a.value if isinstance(a, Done) else a


class LocalActor:
    def __init__(self, obj: Any):
        self.obj = obj

    def call(self, method: Callable, *args: Any) -> Done:
        return Done(getattr(self.obj, method.__name__)(*(_arg(a) for a in args)))

    def kill(self) -> None:
        pass


class ThreadActor:
    """A worker in this process on a thread of its own, beside the driver's: its calls
    run one at a time in submit order, as a Ray actor's do (a call's future arguments
    are waited for on that thread), and its ``@concurrent`` methods at once on the
    caller's thread, as in their own concurrency group. ``threads``: the torch CPU
    threads its thread computes with (torch's count is per thread), so it and the
    driver's thread can split the cores. ``nice``: its thread's CPU priority (Linux's
    per-thread nice; 19 = it runs on what the other threads leave idle), inherited by
    the threads it starts."""

    def __init__(self, obj: Any, threads: int, name: str = "worker", nice: int = 0):
        if nice and not sys.platform.startswith("linux"):
            raise RuntimeError(
                f"a thread of its own at a lower CPU priority needs Linux's per-thread nice "
                f"(this is {sys.platform}): set placement.overlap_share = \"split\"")
        self.obj = obj
        self.pool = cf.ThreadPoolExecutor(
            1, thread_name_prefix=f"rlplane-{name}",
            initializer=_thread_setup, initargs=(threads, nice))

    def call(self, method: Callable, *args: Any) -> Done | ThreadFuture:
        fn = getattr(self.obj, method.__name__)
        if hasattr(method, "concurrency_group"):
            return Done(fn(*(_arg(a) for a in args)))
        return ThreadFuture(self.pool.submit(lambda: fn(*(_arg(a) for a in args))))

    def kill(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def _thread_setup(n: int, nice: int) -> None:
    import torch

    torch.set_num_threads(n)
    if nice:      # on Linux a thread id names one thread to setpriority, not the process
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)


class RayActor:
    def __init__(self, handle):
        self.handle = handle

    @classmethod
    def start(cls, worker_cls: type, args: tuple, gpus: float, pg, bundle: int) -> RayActor:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        remote = ray.remote(concurrency_groups=concurrency_groups(worker_cls))(worker_cls)
        return cls(remote.options(
            num_cpus=0, num_gpus=gpus, scheduling_strategy=PlacementGroupSchedulingStrategy(
                pg, placement_group_bundle_index=bundle,
                # what the worker starts (a reward pool, a reward model) joins the run's
                # reservation and goes when the placement group is removed
                placement_group_capture_child_tasks=True)).remote(*args))

    def call(self, method: Callable, *args: Any) -> RayFuture:
        fn = getattr(self.handle, method.__name__)
        if hasattr(method, "concurrency_group"):
            fn = fn.options(concurrency_group=method.concurrency_group)
        return RayFuture(fn.remote(*(_arg(a) for a in args)))

    def kill(self) -> None:
        import ray

        ray.kill(self.handle)
