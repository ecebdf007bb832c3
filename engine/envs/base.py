"""The environment seam: what a multi-turn task's environment gives the rollout.

    env = Env(**task.env.args)                    one per trajectory (it may keep state)
    messages = env.reset(row)                     the opening messages [{role, content}]
    loop, until done, task.env.max_turns or the trajectory's token budget:
        text = the model's turn (it ends on EOS or one of Env.stop)
        StepResult(observations, reward, done, info) = env.step(text)
        observations -> tokens appended to the context: read, never sampled or trained on
    env.close()                                   if it has one
    env.draw(rng) -> row                          the problem law (train stream, held-out)
    env.demonstration(row, rng) -> messages       optional: a worked trajectory that the
                                                  supervised warm start imitates (its
                                                  "assistant" messages are trained on)

The shape is what OpenEnv (reset / step -> observation, reward, done), SkyRL-Gym's
BaseTextEnv (init -> prompt messages; step(action) -> observations, reward, done,
metadata) and verifiers' MultiTurnEnv (env_response(messages, state) -> messages, state;
is_completed) share: text in, messages out, the episode's end said by the environment.
reset and step may be ``async def`` (an HTTP tool, a sandbox): each call runs on a thread
of its own, bounded by task.env.step_timeout_s, so the steps of a batch's trajectories
overlap one another, and a turn's step starts as soon as that turn is generated.
``info`` is the environment's own; the engine reads "tool_call" (True: the step ran a
tool; env/tool_calls counts them).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import queue
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict


class Message(TypedDict):
    role: str        # "user", "assistant", "tool", "system"
    content: str


@dataclass
class StepResult:
    observations: list[Message]
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class Environment(Protocol):
    stop: tuple[str, ...]
    """Strings (each one token of the policy's tokenizer) that end a model turn besides
    EOS: a tool call's closing mark. The token is kept in the turn's text."""

    def draw(self, rng: random.Random) -> dict[str, Any]: ...

    def reset(self, row: dict[str, Any]) -> list[Message]: ...

    def step(self, text: str) -> StepResult: ...


def render(messages: list[Message]) -> str:
    """The text a list of messages adds to the context without a chat template (the
    built-in model's): the contents, concatenated. With one, engine.rollout.turns
    renders each turn with it."""
    return "".join(m["content"] for m in messages)


@dataclass
class Outcome:
    """One environment call: its value, or why there is none ("error", "timeout")."""
    value: Any = None
    status: str = "ok"
    detail: str = ""
    start: float = 0.0
    end: float = 0.0

    @property
    def seconds(self) -> float:
        return self.end - self.start


def resolve(fn: Callable[[], Any]) -> Any:
    """fn(), awaited when it returns an awaitable (an ``async def`` call)."""
    value = fn()
    if inspect.isawaitable(value):
        async def wait():
            return await value

        value = asyncio.run(wait())
    return value


class _CallThreads:
    """The daemon threads environment calls run on, reused: ``Thread.start`` waits until
    the new thread runs, 0.4 ms a call on the 2-core box while the batch decodes beside
    it (5.4 s of a 50 s guess-env run: 13k calls), where a call handed to an idle thread
    is a queue put. A thread whose call hangs stays with it; the next call finds another
    idle one or starts one, so there are at most as many as calls were in flight at once,
    and none ever holds the process open at exit. (concurrent.futures' pool keeps this
    count the same way, but joins its threads at exit: a hung call would hang it.)"""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)   # one per thread done with its call

    def run(self, job: Callable[[], None]) -> threading.Event:
        """``job()`` on a thread of the pool; the event is set once it returned or raised."""
        done = threading.Event()
        self._jobs.put((job, done))
        if not self._idle.acquire(blocking=False):   # none idle: one more thread takes it
            threading.Thread(target=self._work, daemon=True, name="env-call").start()
        return done

    def _work(self) -> None:
        while True:
            job, done = self._jobs.get()
            try:
                job()
            except BaseException:
                done.set()
                raise                    # this thread ends, never counted idle
            # idle before its caller hears back: a call made right after finds this thread
            self._idle.release()
            done.set()


_threads = _CallThreads()


def _threads_after_fork() -> None:
    global _threads
    _threads = _CallThreads()      # a forked child has none of its parent's threads


os.register_at_fork(after_in_child=_threads_after_fork)


class EnvCalls:
    """Environment calls started one by one, each on a daemon thread the moment it is
    started (a turn's step while the rest of the batch still decodes; _CallThreads), and
    waited for together; each is waited for up to ``timeout_s`` from its own start. A
    call still running then is reported "timeout" and left to finish on its thread
    (Python cannot stop a thread; a daemon one does not hold the process open at exit).
    A raise is "error" with its exception."""

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.time,
                 threads: _CallThreads | None = None):
        self.timeout_s, self.clock = timeout_s, clock
        self.threads = threads          # None: the process's (_threads)
        self._calls: list[tuple[Outcome, threading.Event]] = []

    def start(self, fn: Callable[[], Any]) -> int:
        """Starts ``fn``; returns its place among the outcomes wait() returns."""
        out = Outcome(start=self.clock())        # written by its thread only from here

        def run() -> None:
            try:
                out.value = resolve(fn)
            except Exception as exc:       # the environment's bug: recorded, never raised
                out.status, out.detail = "error", f"{type(exc).__name__}: {exc}"
            finally:
                out.end = self.clock()

        self._calls.append((out, (self.threads or _threads).run(run)))
        return len(self._calls) - 1

    def wait(self) -> list[Outcome]:
        """Every call's outcome, in the order they were started."""
        outcomes = []
        for out, done in self._calls:
            if not done.wait(max(0.0, out.start + self.timeout_s - self.clock())):
                out = Outcome(status="timeout", start=out.start,
                              end=out.start + self.timeout_s,
                              detail=f"still running after {self.timeout_s:g}s")
            outcomes.append(out)
        return outcomes


def call_all(calls: list[Callable[[], Any]], timeout_s: float,
             clock: Callable[[], float] = time.time) -> list[Outcome]:
    """Each call on a thread of its own, all at once (EnvCalls)."""
    pool = EnvCalls(timeout_s, clock)
    for fn in calls:
        pool.start(fn)
    return pool.wait()
