"""What the run pages load from the database, read in one snapshot so that the charts
and ``last_seq`` (where the websocket resumes) describe the same moment."""

from __future__ import annotations

from contextlib import contextmanager

from django.db import connection, transaction
from django.db.models import Max, OuterRef, Subquery

from engine.config import dump_config, validate_config
from jobs import charts
from jobs.models import TERMINAL, MetricPoint, PhaseSpan, Run, RunControl, RunEvent

LOG_LINES = 200  # the newest log lines a page starts with


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


def latest_metric(name: str, field: str = "value") -> Subquery:
    rows = MetricPoint.objects.filter(run=OuterRef("pk"), name=name).order_by("-step")
    return Subquery(rows.values(field)[:1])


def runs_with_latest_metrics():
    return Run.objects.filter(archived_at=None).annotate(
        reward_mean=latest_metric("reward/mean"), step_s=latest_metric("time/step_s"),
        step=latest_metric("time/step_s", "step"),
    )


def metric_steps(run: Run) -> list[tuple[int, dict]]:
    """[(step, {metric: value})] in step order, for the metrics some chart reads."""
    rows = (MetricPoint.objects.filter(run=run, name__in=charts.metric_names())
            .order_by("step").values_list("step", "name", "value"))
    steps: dict[int, dict] = {}
    for step, name, value in rows:
        steps.setdefault(step, {})[name] = value
    return list(steps.items())


def recent_spans(run: Run) -> list[dict]:
    last = PhaseSpan.objects.filter(run=run).aggregate(m=Max("step"))["m"]
    if last is None:
        return []
    rows = PhaseSpan.objects.filter(run=run, step__gt=last - charts.TIMELINE_STEPS)
    return list(rows.order_by("start").values("device", "phase", "start", "end"))


def chart_data(run: Run) -> dict:
    """The json_script the run page draws from, the seq its websocket resumes after, and
    the statuses after which the run has nothing left to stop."""
    with snapshot():
        last_seq = RunEvent.objects.filter(run=run).aggregate(m=Max("seq"))["m"] or 0
        algorithm = validate_config(run.config, check_files=False).algorithm.type
        figures = charts.metric_figures(metric_steps(run), algorithm)
        figures.append(charts.timeline_figure(recent_spans(run)))
        applied = (RunControl.objects.filter(run=run).exclude(applied_at=None)
                   .order_by("id").values_list("applied_step", "kind", "value"))
        marks = charts.control_marks(applied)
    return {"run_id": run.pk, "last_seq": last_seq, "ws_path": f"/ws/runs/{run.pk}/",
            "terminal_statuses": sorted(TERMINAL), "charts": figures, "marks": marks}


LOG_TYPES = ("log", "control.applied")  # the log panel's lines; controls name who


def log_lines(events: list[dict]) -> list[dict]:
    """Log events as the log panel shows them: a control applied is a "control" line."""
    return [e if e["type"] == "log" else {**e, "level": "control"} for e in events
            if e["type"] in LOG_TYPES]


def recent_logs(run: Run) -> list[dict]:
    rows = RunEvent.objects.filter(run=run, type__in=LOG_TYPES).order_by("-seq")[:LOG_LINES]
    return log_lines([row.payload for row in reversed(rows)])


def config_toml(run: Run) -> str:
    return dump_config(validate_config(run.config, check_files=False))


def run_facts(run: Run) -> list[tuple[str, str]]:
    """What the run trains, on what, and how: the run header's line."""
    cfg = validate_config(run.config, check_files=False)
    task = cfg.task.type + (f" {cfg.task.path}" if cfg.task.type == "dataset" else "")
    placement = cfg.placement.type
    if cfg.placement.type == "disaggregated":
        placement += (f" ({cfg.placement.rollout_workers} rollout x "
                      f"{cfg.placement.devices_per_worker}, learner "
                      f"{cfg.placement.learner_devices})")
    return [("model", str(cfg.model.path) if cfg.model.path else cfg.model.size),
            ("task", task), ("reward", cfg.reward.type),
            ("algorithm", cfg.algorithm.type), ("placement", placement),
            ("async policy", cfg.async_policy.type), ("steps", str(cfg.steps))]



def current_lr(run: Run) -> float:
    """The policy's learning rate as the learner last reported it (learner/lr), else the
    config's: what the live lr control starts from."""
    latest = (MetricPoint.objects.filter(run=run, name="learner/lr").order_by("-step")
              .values_list("value", flat=True).first())
    return latest if latest is not None else validate_config(
        run.config, check_files=False).algorithm.lr
