"""Environment calls on a pool of Ray actors (task.env.workers = "ray").

    pool = env_pool(task.env.ray_actors)           one per process, made on first use
    env = pool.proxy(trajectory)                   what the runner calls reset/step/close on
    env.step(text)                                 on an EnvCalls thread, as ever:
        -> actor.call(trajectory.env, "step", (text,))     the env, pickled, runs there
        <- (env as the call left it, value)        trajectory.env = that env; value

The runner's threads, timeouts and counting stay as they are (engine.envs.base.EnvCalls):
a thread waits on the actor's answer instead of running the call. Each actor runs many
calls at once on threads of its own (max_concurrency), so one that hangs past
task.env.step_timeout_s holds a thread there, not the pool. An exception the environment
raises comes back as itself (not Ray's wrapper), so failures read as under threads.
num_cpus = 0: the actors take no CPU of the placement (the rollout worker's bundle holds
the work they do in its name).
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

from engine.envs.base import resolve

CALLS_PER_ACTOR = 64


class EnvWorker:
    """Runs an environment's calls where it is placed (a Ray actor)."""

    def call(self, env: Any, method: str, args: tuple) -> tuple[Any, Any]:
        return env, resolve(lambda: getattr(env, method)(*args))


class EnvPool:
    def __init__(self, size: int):
        import ray

        worker = ray.remote(num_cpus=0, max_concurrency=CALLS_PER_ACTOR)(EnvWorker)
        self.actors = [worker.remote() for _ in range(size)]
        self._turn = itertools.count()

    def proxy(self, owner) -> RemoteEnv:
        """``owner``'s environment (owner.env), each call run on the pool."""
        return RemoteEnv(self.actors[next(self._turn) % len(self.actors)], owner)


class RemoteEnv:
    """A trajectory's environment as the runner calls it; its state lives in owner.env."""

    def __init__(self, actor, owner):
        self.actor, self.owner = actor, owner

    def reset(self, row):
        return self._call("reset", row)

    def step(self, text: str):
        return self._call("step", text)

    def close(self):
        return self._call("close")

    def _call(self, method: str, *args) -> Any:
        import ray
        from ray.exceptions import RayTaskError

        try:
            env, value = ray.get(self.actor.call.remote(self.owner.env, method, args))
        except RayTaskError as exc:
            raise exc.cause from None                  # the environment's own exception
        self.owner.env = env
        return value


@functools.cache
def env_pool(size: int) -> EnvPool:
    """This process's pool (a rollout worker's), made once."""
    return EnvPool(size)
