"""What the run pages load from the database, read in one snapshot so that the charts
and ``last_seq`` (where the websocket resumes) describe the same moment."""

from __future__ import annotations

import math
from contextlib import contextmanager

import tomli_w
from django.db import connection, transaction
from django.db.models import Count, Max, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from engine.api import (
    ControlError,
    check_control,
    launch_rollout_workers,
    validate_control,
)
from engine.api import metrics as M
from engine.config import FRAMEWORK_LABELS, dump_config
from jobs import charts
from jobs.models import (
    LIVE,
    LIVE_STATES,
    TERMINAL,
    Alert,
    MetricPoint,
    MetricRollup,
    PhaseSpan,
    Run,
    RunControl,
    RunEvent,
    last_steps,
    stored_metric_names,
)
from jobs.queries import history
from jobs.rollups import TIERS

LOG_LINES = 200  # the newest log lines a page starts with
REPLACED = "worker.replaced"  # a rollout worker the engine replaced: a mark on the charts


@contextmanager
def snapshot():
    """Postgres reads each statement at its own moment by default; REPEATABLE READ pins
    them to the first. (SQLite's transaction already reads one snapshot.)"""
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if outermost and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        yield


def latest_metric(name: str, field: str = "value") -> Coalesce:
    """The run's last ``name`` point's value (or step); a run whose raw points were
    dropped (RLPLANE_RAW_POINTS_RETENTION_DAYS): its coarsest tier's last bucket's."""
    rows = MetricPoint.objects.filter(run=OuterRef("pk"), name=name).order_by("-step")
    kept = (MetricRollup.objects.filter(run=OuterRef("pk"), name=name, width=TIERS[-1])
            .order_by("-bucket"))
    return Coalesce(Subquery(rows.values(field)[:1]),
                    Subquery(kept.values("last" if field == "value" else "last_step")[:1]))


def runs_with_latest_metrics(runs=None):
    """``runs`` (default: every run not archived) with what the runs list shows of each."""
    runs = Run.objects.filter(archived_at=None) if runs is None else runs
    return runs.annotate(
        reward_mean=latest_metric(M.REWARD_MEAN), step_s=latest_metric(M.TIME_STEP_S),
        step=latest_metric(M.TIME_STEP_S, "step"),
        held_out=latest_metric(M.EVAL_REWARD_MEAN),
        open_alerts=open_alert_count(),
    )


def open_alert_count() -> Coalesce:
    """A run's open and acknowledged alerts, as a correlated subquery: a joined Count
    would make the list's query GROUP BY every run column."""
    rows = (Alert.objects.filter(run=OuterRef("pk"), state__in=LIVE_STATES).order_by()
            .values("run").annotate(n=Count("pk")).values("n"))
    return Coalesce(Subquery(rows), 0)


def recent_spans(run: Run) -> list[dict]:
    last = PhaseSpan.objects.filter(run=run).aggregate(m=Max("step"))["m"]
    if last is None:
        return []
    rows = PhaseSpan.objects.filter(run=run, step__gt=last - charts.TIMELINE_STEPS)
    return list(rows.order_by("start").values("device", "phase", "start", "end"))


# The metrics the page's header follows live (static/js/run_charts.js reads the names here).
PROGRESS_METRICS = {"reward": M.REWARD_MEAN,
                    "held_out": M.EVAL_REWARD_MEAN}


def chart_data(run: Run) -> dict:
    """The json_script the run page draws from, the seq its websocket resumes after, and
    the statuses after which the run has nothing left to stop, the header's metric names."""
    with snapshot():
        last_seq = RunEvent.highest_seq(run)
        algorithm = "external" if run.is_external else run.run_config.algorithm.type
        # An external run's names that no chart reads (its framework's own, kept as they
        # are, and canonical ones no built-in chart draws) get a chart each.
        others = charts.other_names(stored_metric_names(run.pk)) if run.is_external else []
        series = history.load(run, charts.metric_names() | set(others))
        figures = charts.metric_figures(series.steps, algorithm, others, series.width,
                                        series.steps_reported)
        multi_turn = not run.is_external and run.run_config.task.type == "env"
        figures.append(charts.timeline_figure(recent_spans(run), algorithm, multi_turn))
        applied = (RunControl.objects.filter(run=run).exclude(applied_at=None)
                   .order_by("id").values_list("applied_step", "kind", "value"))
        replaced = (RunEvent.objects.filter(run=run, type=REPLACED).order_by("seq")
                    .values_list("payload", flat=True))
        marks = (charts.control_marks(applied) + charts.replacement_marks(replaced)
                 + charts.restart_marks(run.restarts))
        # Only the steps some chart draws (thinned on long runs); live steps bring their own.
        drawn = {x for figure in figures if figure["id"] != "timeline"
                 for trace in figure["traces"] for x in trace["x"]}
        times = {x: t for x, t in series.times.items() if x in drawn}
        times.update(history.times_at(series.times, [mark["step"] for mark in marks]))
    return {"run_id": run.pk, "last_seq": last_seq, "ws_path": f"/ws/runs/{run.pk}/",
            "terminal_statuses": sorted(TERMINAL), "charts": figures, "marks": marks,
            "step_times": times, "metric_names": PROGRESS_METRICS}


LOG_TYPES = ("log", "control.applied")  # the log panel's lines; controls name who


def log_lines(events: list[dict]) -> list[dict]:
    """Log events as the log panel shows them: a control applied is a "control" line."""
    return [e if e["type"] == "log" else {**e, "level": "control"} for e in events
            if e["type"] in LOG_TYPES]


def recent_logs(run: Run) -> list[dict]:
    """The newest LOG_LINES lines: what the run's process reported (seq order) and, for a
    launched command, its Ray job's output (seqs below 0, newest lowest:
    jobs/runs/job_logs.py), merged by time."""
    # One query per type: each reads the (run, type, seq) index newest first and stops;
    # with type IN (...) SQLite walks every event of the run by seq instead.
    rows = sorted((row for kind in LOG_TYPES for row in RunEvent.objects.filter(
        run=run, type=kind, seq__gt=0).order_by("-seq")[:LOG_LINES]),
        key=lambda row: row.seq, reverse=True)
    if run.is_external:
        logs = RunEvent.objects.filter(run=run, type__in=LOG_TYPES)
        rows += logs.filter(seq__lt=0).order_by("seq")[:LOG_LINES]
        rows.sort(key=lambda row: (row.ts, abs(row.seq)), reverse=True)
    return log_lines([row.payload for row in reversed(rows[:LOG_LINES])])


def config_toml(run: Run) -> str:
    if run.is_external:
        return tomli_w.dumps(run.external_config.model_dump(mode="json", exclude_none=True))
    return dump_config(run.run_config)


def run_facts(run: Run) -> list[tuple[str, str]]:
    """What the run trains, on what, and how: the run header's line."""
    if run.is_external:
        return external_facts(run)
    cfg = run.run_config
    task = cfg.task.type + (f" {cfg.task.path}" if cfg.task.type == "dataset" else "")
    placement = cfg.placement.type
    if cfg.placement.type == "disaggregated":
        placement += (f" ({cfg.placement.rollout_workers} rollout x "
                      f"{cfg.placement.devices_per_worker}, learner "
                      f"{cfg.placement.learner_devices})")
    resized = ([] if run.rollout_workers is None
               else [("rollout workers", f"{run.rollout_workers} (resized live)")])
    return [("model", str(cfg.model.path) if cfg.model.path else cfg.model.size),
            ("task", task), ("reward", cfg.reward.type),
            ("algorithm", cfg.algorithm.type), ("placement", placement), *resized,
            ("async policy", cfg.async_policy.type), ("steps", str(cfg.steps))]


FACT_PARAMS = 6  # an external run's header shows this many of its own parameters


def external_facts(run: Run) -> list[tuple[str, str]]:
    """An external run's header: its framework, how it runs, its first parameters."""
    cfg = run.external_config
    how = cfg.launch.entrypoint if cfg.launch else "reports from its own process"
    facts = [("framework", FRAMEWORK_LABELS.get(cfg.framework, cfg.framework)),
             ("command", how)]
    facts += [(str(k), str(v)[:80]) for k, v in list(cfg.params.items())[:FACT_PARAMS]]
    return facts


def current_lr(run: Run) -> float | None:
    """The policy's learning rate as the learner last reported it (learner/lr), else the
    config's: what the live lr control starts from."""
    latest = latest_point(run, M.LEARNER_LR)
    if latest is not None and latest[1] is not None:
        return latest[1]
    return None if run.is_external else run.run_config.algorithm.lr


def rollout_workers(run: Run) -> int | None:
    """The rollout workers a native run has now (its latest live resize, else its launch
    placement's), when set_rollout_workers can change them (engine.api.check_control);
    None when it cannot: the run page then offers no such control."""
    if run.is_external:
        return None
    cfg = run.run_config
    try:
        check_control(validate_control({"kind": "set_rollout_workers", "value": 1}), cfg)
    except ControlError:
        return None
    return launch_rollout_workers(cfg) if run.rollout_workers is None else run.rollout_workers


def latest_point(run: Run, name: str) -> tuple[int, float | None] | None:
    """(step, value) of the metric's last reported step, or None."""
    return (MetricPoint.objects.filter(run=run, name=name).order_by("-step")
            .values_list("step", "value").first()
            or MetricRollup.objects.filter(run=run, name=name, width=TIERS[-1])
            .order_by("-bucket").values_list("last_step", "last").first())


ETA_STEPS = 20  # the ETA extrapolates the mean step time of this many latest steps


def external_steps(run: Run) -> int | None:
    """An external run's planned steps when its parameters say (TRL's max_steps, veRL's
    total_training_steps, or steps), else None: the header then shows no total or ETA."""
    params = run.external_config.params
    for key in ("steps", "max_steps", "total_training_steps"):
        value = params.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def run_progress(run: Run) -> dict:
    """The run header's "how is it going": step k of n (steps trained, as the checkpoints
    count them), elapsed, ETA (while live), latest training and held-out reward, open
    alerts. ``clock`` is what the page's clock ticks from between websocket messages."""
    steps = external_steps(run) if run.is_external else run.run_config.steps
    recent = list(MetricPoint.objects.filter(run=run, name=M.TIME_STEP_S).order_by("-step")
                  .values_list("step", "value")[:ETA_STEPS])
    step = recent[0][0] if recent else None
    if step is None and run.is_external:  # a framework that reports no step time
        step = max(last_steps(run, stored_metric_names(run.pk)).values(), default=None)
    done = run.steps_done(step)
    now = timezone.now()
    elapsed = None
    if run.started_at is not None:
        elapsed = ((run.finished_at or now) - run.started_at).total_seconds()
    eta = None
    durations = [v for _, v in recent if v is not None]
    if run.status in LIVE and durations and done is not None and steps is not None:
        eta = max(0, steps - done) * sum(durations) / len(durations)

    return {"step": done, "steps": steps, "elapsed_s": elapsed, "eta_s": eta,
            "reward": latest_point(run, M.REWARD_MEAN),
            "held_out": latest_point(run, M.EVAL_REWARD_MEAN),
            "open_alerts": run.alerts.filter(state__in=LIVE_STATES).count(),
            "clock": progress_clock(run, done, eta, now, steps)}


def progress_clock(run: Run, done: int | None, eta: float | None, now,
                   steps: int | None = None) -> dict:
    """What run_charts.js ticks the header's elapsed and ETA from (unix seconds): the
    server's ``now`` lets it correct for its own clock; a finished run's elapsed stands
    still at ``finished_at`` and has no ETA. ``steps``: the run's total (clock_after's)."""
    def unix(t):
        return None if t is None else t.timestamp()
    return {"now": now.timestamp(), "started_at": unix(run.started_at),
            "finished_at": unix(run.finished_at), "eta_s": eta, "step": done,
            "steps": steps, "status": run.status, "terminal": run.is_terminal}


def clock_after(clock: dict, events: list[dict], external: bool, now: float) -> dict:
    """``clock`` (progress_clock's, read a moment ago) moved on to ``now`` by newer events:
    the steps their metrics trained (counted as run_progress counts them: a step time
    marks a training step, an external framework's metrics name their own count), and
    the ETA for the steps left at the read's seconds a step (or, no step done since, the
    read's ETA less the time since; or, the read had none, at these events' step times).
    The status stays as read."""
    trained = [e["step"] for e in events if e["type"] == "metrics.append"
               and (external or M.TIME_STEP_S in e["values"])]
    before, total, eta = clock["step"], clock.get("steps"), clock["eta_s"]
    done = before
    if trained:
        done = max(max(trained) if external else max(trained) + 1, before or 0)
    took = [t for e in events if e["type"] == "metrics.append"
            and isinstance(t := e["values"].get(M.TIME_STEP_S), int | float)
            and math.isfinite(t)]
    if eta is None and took and total is not None and done is not None \
            and not clock["terminal"]:
        eta = max(0, total - done) * sum(took) / len(took)
    elif eta is not None:
        if done != before and before is not None and total is not None and total > before:
            eta = max(0, total - done) * eta / (total - before)
        else:
            eta = max(0.0, eta - (now - clock["now"]))
    return {**clock, "now": now, "step": done, "eta_s": eta}
