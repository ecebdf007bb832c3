"""DataIntegrity: the run's data ledger shows a gap or a repeat in the training prompts.

The engine's ledger (engine/orchestration/ledger.py) counts, so far in the run and across
resumes (it is checkpointed with the weights): prompts served, trained and dropped, the
data positions passed over without being served (data/skipped) and the prompts served or
trained again after they were trained or dropped (data/repeated). A run that serves each
training prompt exactly once an epoch keeps both at 0 and data/served never falls.

    gap       data/skipped rose: prompts of the epoch are never served (a resume that
              lost its place: NeMo-RL #3599, ~30 % of a dataset never reached)
    repeat    data/repeated rose: prompts trained twice (OpenRLHF #1322)
    restart   data/served fell below what an earlier step had served by more than a
              step's draws: the ledger, and the data position with it, started over
"""

from __future__ import annotations

from engine.api import metrics as M
from jobs.alerts.evidence import chart
from jobs.alerts.history import Finding, RunFacts, RunHistory, Thresholds
from jobs.alerts.inputs import reads
from jobs.alerts.levers import listed

COUNTS = (M.DATA_SERVED, M.DATA_TRAINED, M.DATA_DROPPED, M.DATA_EPOCH, M.DATA_SKIPPED,
          M.DATA_REPEATED)


def onset(points: list[tuple[int, float]]) -> int | None:
    """The first step whose count is over the step before's (over 0 for the first)."""
    before = 0.0
    for step, value in points:
        if value > before:
            return step
        before = value
    return None


def restart(points: list[tuple[int, float]]) -> tuple[int, float, float] | None:
    """(step, served there, most served before) where the served count fell by more than
    the most one step served: a ledger that started over, not a resumed step's few
    prompts drawn in another order."""
    rises = [b - a for (_, a), (_, b) in zip(points, points[1:], strict=False)]
    slack = max((r for r in rises if r > 0), default=0.0)
    most = 0.0
    for step, value in points:
        if most - value > slack:
            return step, value, most
        most = max(most, value)
    return None


@reads(metrics=(M.DATA_SERVED,))
def data_integrity(h: RunHistory, f: RunFacts, t: Thresholds, now: float) -> list[Finding]:
    found = []
    for name, key in ((M.DATA_SKIPPED, "gap"), (M.DATA_REPEATED, "repeat")):
        pts = h.series(name)
        if not pts or pts[-1][1] <= 0:
            continue
        step, count = onset(pts), pts[-1][1]
        values = _values(h, pts[-1][0])
        if key == "gap":
            cause = (f"{count:.0f} training prompt(s) were passed over without being served, "
                     f"from step {step} on: a gap in the data (the epoch's order went on past "
                     f"them), so they never reach the learner this epoch.")
        else:
            cause = (f"{count:.0f} training prompt(s) were served or trained again after "
                     f"they were trained or dropped, from step {step} on: the learner sees "
                     f"them more than once this epoch.")
        found.append(_finding(h, f, key, step, cause, values, name))
    served = restart(h.series(M.DATA_SERVED))
    if served is not None:
        step, now_served, before = served
        cause = (f"The data ledger started over at step {step}: {now_served:.0f} prompts "
                 f"served, where an earlier step had counted {before:.0f}. A resume or a "
                 f"driver restart that lost the checkpoint's data position serves the epoch's "
                 f"first prompts again.")
        found.append(_finding(h, f, "restart", step, cause, _values(h, step), M.DATA_SERVED))
    return found


def _values(h: RunHistory, step: int) -> dict[str, float | None]:
    return {name: h.metrics.get(name, {}).get(step) for name in COUNTS}


def _finding(h: RunHistory, f: RunFacts, key: str, step: int | None, cause: str,
             values: dict, name: str) -> Finding:
    return Finding(kind="DataIntegrity", key=f"DataIntegrity:{key}", step=step, cause=cause,
                   runbook=_runbook(f, key, step),
                   evidence={"values": values, "series": chart(h, name),
                             "compare": chart(h, M.DATA_SERVED if name != M.DATA_SERVED
                                              else M.DATA_TRAINED)})


def _runbook(f: RunFacts, key: str, step: int | None) -> str:
    lead = ("Each checkpoint directory holds data.json, the data position (epoch, offset, "
            "the prompts still pending) and the ledger a resumed run continues; the run's "
            "log says where each resume started its data. To serve the prompts missed or "
            f"undo the repeat, resume from the last checkpoint before step {step} once the "
            "cause is fixed.")
    if f.is_external:
        return ("Check that the framework saves its dataloader's position with the "
                "checkpoint and restores it on resume (the sampler's epoch and offset), and "
                "resume from the last checkpoint before the gap.")
    faults, out = f.config.faults, []
    if key == "gap" and faults.skip_on_resume is not None:
        out.append(f"faults.skip_on_resume (prompts = {faults.skip_on_resume.prompts}) "
                   "rehearses this alert: remove the [faults.skip_on_resume] table")
    if key == "repeat" and faults.staleness_overrun is not None:
        out.append("faults.staleness_overrun hands the learner earlier batches again: remove "
                   "the [faults.staleness_overrun] table")
    if key in ("gap", "restart"):
        out.append("resume only from a checkpoint that holds data.json (one without it, "
                   "written by an engine from before the ledger, resumes the data at "
                   "step x rollout.prompts_per_step)")
    return listed(out, lead) if out else lead
