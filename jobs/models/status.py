"""The run's life as an explicit state machine. Terminal states are final.

    queued --> submitting --> running --> stopping --> stopped
      |            |            |            |
      |            |            +------------+-------> succeeded
      +------------+------------+------------+-------> failed | lost
      +--- cancelled while it waits in the queue ----> stopped
"""

from django.db import models


class RunStatus(models.TextChoices):
    QUEUED = "queued"
    SUBMITTING = "submitting"
    RUNNING = "running"
    STOPPING = "stopping"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"
    LOST = "lost"


S = RunStatus
TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    S.QUEUED: frozenset({S.SUBMITTING, S.STOPPED, S.FAILED, S.LOST}),
    S.SUBMITTING: frozenset({S.RUNNING, S.FAILED, S.LOST}),
    S.RUNNING: frozenset({S.STOPPING, S.SUCCEEDED, S.FAILED, S.LOST}),
    S.STOPPING: frozenset({S.STOPPED, S.SUCCEEDED, S.FAILED, S.LOST}),
}
TERMINAL = frozenset({S.SUCCEEDED, S.FAILED, S.STOPPED, S.LOST})
# Submitted and not final: a Ray job may be working on it and sending events.
LIVE = frozenset({S.SUBMITTING, S.RUNNING, S.STOPPING})
# A live control may be asked of these: the driver polls it once it runs; a stopping run
# is on its way out and would apply none.
CONTROLLABLE = frozenset({S.SUBMITTING, S.RUNNING})


def sources_of(new: RunStatus) -> list[str]:
    """The states from which a run may move to ``new``."""
    return sorted(old for old, targets in TRANSITIONS.items() if new in targets)


def path_between(old: RunStatus, new: RunStatus) -> list[RunStatus]:
    """The shortest walk along TRANSITIONS from ``old`` to ``new`` (``old`` left out,
    ``new`` last), or [] when none leads there: submitting -> stopped is
    [running, stopping, stopped]. Breadth first, so each state is visited once."""
    came_from: dict[RunStatus, RunStatus | None] = {RunStatus(old): None}
    frontier = [RunStatus(old)]
    while frontier and new not in came_from:
        state = frontier.pop(0)
        for target in sorted(TRANSITIONS.get(state, ())):
            if target not in came_from:
                came_from[target] = state
                frontier.append(target)
    if new not in came_from or new == old:
        return []
    path = [RunStatus(new)]
    while (before := came_from[path[-1]]) != old:
        path.append(before)
    return path[::-1]


class InvalidTransition(Exception):
    def __init__(self, run_id: int, current: str | None, new: str):
        self.run_id, self.current, self.new = run_id, current, new
        if current is None:
            message = f"run {run_id} does not exist"
        elif current in TERMINAL:
            message = f"run {run_id} is {current}, which is final; it cannot become {new}"
        else:
            allowed = ", ".join(sorted(TRANSITIONS[RunStatus(current)]))
            message = f"run {run_id} cannot go from {current} to {new} (allowed: {allowed})"
        super().__init__(message)
