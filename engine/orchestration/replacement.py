"""A rollout worker that dies is replaced, and the run goes on, within a budget.

    r = Replacements(d, tel, cfg.placement.max_worker_replacements)
    r.replace(i, handle, cause, step)    # a call of worker i (``handle``) failed: ActorLost
    r.replace_lost(step)                 # the workers d.lost holds (a weight sync or a
                                         # telemetry call found them dead)

    worker i dead -> budget left? --no--> WorkerLostError: the run fails, saying why
                          | yes
                     kill it (a hung one), start a RolloutWorker on its bundle
                     d.sync.rejoin: the learner's current weights, fingerprinted on both
                     ends, before the new worker generates (mismatch: the run fails)
                     worker.replaced event (a mark on the charts) + a warning log line

The prompts the dead worker held are dropped, counted under ``error`` in the data ledger,
by the policy that gave them (engine.orchestration.policies), which draws new ones in
their place. ``replace`` is keyed on the handle: a worker already replaced (its death
seen again by another call in flight) is not replaced twice.
"""

from __future__ import annotations

from typing import Any

from engine.events import WorkerReplacedEvent
from engine.orchestration.actors import ActorLost
from engine.orchestration.deployment import Deployment


class WorkerLostError(RuntimeError):
    """A rollout worker died and the run cannot replace it."""


def check_budget(made: int, limit: int, index: int, step: int, cause: str) -> None:
    """WorkerLostError when ``made`` replacements already spend the run's ``limit``."""
    if made < limit:
        return
    spent = (f"the run already replaced {made} worker(s), its bound" if limit
             else "replacing workers is off")
    raise WorkerLostError(
        f"rollout worker {index} died at step {step} ({cause}); {spent} "
        f"(placement.max_worker_replacements = {limit}): the run fails. Find why workers "
        f"die (out of memory, a lost node), or raise placement.max_worker_replacements")


class Replacements:
    def __init__(self, d: Deployment, tel, limit: int):
        self.d, self.tel, self.limit = d, tel, limit
        self.made = 0

    def replace(self, index: int, handle: Any, cause: str, step: int) -> None:
        if self.d.workers[index] is not handle:
            return                       # replaced already
        check_budget(self.made, self.limit, index, step, cause)
        self.made += 1
        try:
            res = self.d.replace_worker(index, step)
        except ActorLost as exc:
            raise WorkerLostError(f"the worker replacing rollout worker {index} at step "
                                  f"{step} died before it served weights: {exc.cause}") from exc
        self.tel.emit(WorkerReplacedEvent(
            step=step, worker=index, cause=cause, version=res.version_learner,
            fingerprint_learner=res.fingerprint_learner,
            fingerprint_worker=res.fingerprint_rollout, matched=res.matched,
            replacements=self.made))
        if not res.matched:
            raise WorkerLostError(f"the worker replacing rollout worker {index} at step "
                                  f"{step} does not serve the learner's weights: "
                                  f"{res.mismatch()}")
        self.tel.log(f"step {step}: rollout worker {index} replaced ({self.made} of at most "
                     f"{self.limit}) and serving v{res.version_learner} "
                     f"({res.fingerprint_learner}): {cause}", level="warning")

    def replace_lost(self, step: int) -> None:
        for index, (handle, cause) in list(self.d.lost.items()):
            del self.d.lost[index]
            self.replace(index, handle, cause, step)
