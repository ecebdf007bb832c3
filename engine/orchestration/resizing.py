"""Elastic rollout capacity: a set_rollout_workers control, applied between two steps.

    r = Resizing(d, policy, tel, cfg)
    message = r.resize(n, step, version)      # at the boundary before ``step``

    n > now:  room for them all?       refused at once when the cluster could never hold
                                       them besides what the run holds
              for each new worker      d.add_worker: a place of its own (one bundle like
                                       the last launch worker's; an idle launch bundle
                                       first), the actor, the learner's current weights
                                       fingerprinted on both ends -- before it generates
              policy.joined(version)   the policy dispatches to it from now on
              cannot place it within placement.ready_timeout_s, it died, or it serves
              other weights: the ones added by this control leave again, the control is
              refused (a warning), the run goes on with the workers it had
    n < now:  for each, the last first  policy.retire: its call in flight finishes, its
                                       groups go to the buffer; d.retire_worker: out of
                                       the sync, its last spans drained, closed, killed,
                                       its place given back
    -> workers.resized {step, previous, workers, version, fingerprints, devices}
       + rollout/workers in each step's metrics (the dashboard's and the queue's count)

Refused before anything moves (check_control): a run whose worker lives in the driver's
process, and a collective weight sync (its process group fixed at the start).
"""

from __future__ import annotations

from engine.config import RunConfig
from engine.controls import ControlError, SetRolloutWorkersControl, check_control
from engine.events import WorkersResizedEvent
from engine.orchestration.actors import ActorLost
from engine.orchestration.deployment import Deployment
from engine.orchestration.placement import PlacementError
from engine.orchestration.policies import AsyncPolicy
from engine.telemetry.recorder import Telemetry


class ResizeError(RuntimeError):
    """A worker added by a resize does not serve the learner's weights."""


class Resizing:
    def __init__(self, d: Deployment, policy: AsyncPolicy, tel: Telemetry, cfg: RunConfig):
        self.d, self.policy, self.tel, self.cfg = d, policy, tel, cfg

    def resize(self, n: int, step: int, version: int) -> str:
        """The run's rollout workers made ``n`` before ``step`` (the learner at
        ``version``, the weights every worker serves); what happened, in a sentence."""
        before = len(self.d.workers)
        try:
            check_control(SetRolloutWorkersControl(value=n), self.cfg)
        except ControlError as exc:
            return self._refuse(n, before, exc.errors[0][1])
        if n == before:
            return f"already {n} rollout worker(s)"
        fingerprints: list[str] = []
        fingerprint_learner = ""
        if n > before:
            try:
                self.d.places.check_room(n - before)
                for _ in range(n - before):
                    res = self.d.add_worker(step)
                    self.policy.joined(version)
                    fingerprints.append(res.fingerprint_rollout)
                    fingerprint_learner = res.fingerprint_learner
                    if not res.matched:
                        raise ResizeError(f"the new worker does not serve the learner's "
                                          f"weights: {res.mismatch()}")
            except (PlacementError, ActorLost, ResizeError) as exc:
                self._shrink_to(before)
                return self._refuse(n, before, str(exc))
        else:
            self._shrink_to(n)
        self.tel.devices[:] = self.d.places.devices      # bubble and utilization count them
        self.tel.emit(WorkersResizedEvent(
            step=step, previous=before, workers=n, version=version,
            fingerprint_learner=fingerprint_learner, fingerprints=fingerprints,
            devices=[x for p in self.d.places.used for x in p.slot.devices]))
        grown = (f"; each new one serving v{version} ({fingerprint_learner})"
                 if fingerprints else "")
        message = f"rollout workers {before} -> {n} from step {step}{grown}"
        self.tel.log(message)
        return message

    def _shrink_to(self, n: int) -> None:
        while len(self.d.workers) > n:
            self.policy.retire(len(self.d.workers) - 1)
            self.tel.ingest(self.d.retire_worker())     # its last spans count too

    def _refuse(self, n: int, before: int, why: str) -> str:
        message = (f"refused: set_rollout_workers {n}: {why}; the run goes on with "
                   f"{before} rollout worker(s)")
        self.tel.log(message, level="warning")
        return message
