"""One way to call a worker, wherever it runs.

    h = LocalActor(RolloutWorker(...))           # in the driver's process: runs at once
    h = RayActor.start(RolloutWorker, args, slot, pg, threads)   # on its bundle
    f = h.call("produce", step, problems, seed)  # -> Future; calls run in submit order
    f.result();  wait_any([f, g])                # first finished futures
    meta, tensors = h.call("publish", step, num_returns=2)
    w.call("receive_weights", meta_version, tensors)   # a Ray future passes as a ref

A Ray actor runs its calls one at a time, in order, except ``drain_spans``, which runs
in a concurrency group of its own so the driver can read a worker's running spans while
it generates.
"""

from __future__ import annotations

from typing import Any


class Done:
    """A value computed in this process."""

    def __init__(self, value: Any):
        self.value = value

    def result(self) -> Any:
        return self.value

    def done(self) -> bool:
        return True


class RayFuture:
    def __init__(self, ref):
        self.ref = ref

    def result(self) -> Any:
        import ray

        return ray.get(self.ref)

    def done(self) -> bool:
        import ray

        return bool(ray.wait([self.ref], timeout=0)[0])


def wait_any(futures: list) -> list:
    """The futures among ``futures`` that are done, waiting for at least one."""
    done = [f for f in futures if isinstance(f, Done)]
    if done:
        return done
    import ray

    ready, _ = ray.wait([f.ref for f in futures], num_returns=1)
    return [f for f in futures if f.ref in ready]


def _arg(a: Any) -> Any:
    return a.ref if isinstance(a, RayFuture) else a.value if isinstance(a, Done) else a


class LocalActor:
    def __init__(self, obj: Any):
        self.obj = obj

    def call(self, method: str, *args: Any, num_returns: int = 1):
        out = getattr(self.obj, method)(*(_arg(a) for a in args))
        return Done(out) if num_returns == 1 else tuple(Done(v) for v in out)

    def kill(self) -> None:
        pass


class RayActor:
    def __init__(self, handle):
        self.handle = handle

    @classmethod
    def start(cls, worker_cls: type, args: tuple, gpus: float, pg, bundle: int) -> RayActor:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        remote = ray.remote(concurrency_groups={"telemetry": 1})(worker_cls).options(
            num_cpus=0, num_gpus=gpus, scheduling_strategy=PlacementGroupSchedulingStrategy(
                pg, placement_group_bundle_index=bundle,
                # what the worker starts (a reward pool, a reward model) joins the run's
                # reservation and goes when the placement group is removed
                placement_group_capture_child_tasks=True))
        return cls(remote.remote(*args))

    def call(self, method: str, *args: Any, num_returns: int = 1):
        fn = getattr(self.handle, method)
        if method == "drain_spans":
            fn = fn.options(concurrency_group="telemetry")
        elif num_returns != 1:
            fn = fn.options(num_returns=num_returns)
        refs = fn.remote(*(_arg(a) for a in args))
        return RayFuture(refs) if num_returns == 1 else tuple(RayFuture(r) for r in refs)

    def kill(self) -> None:
        import ray

        ray.kill(self.handle)
