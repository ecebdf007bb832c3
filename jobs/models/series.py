"""What the run page charts: one row per (metric, step), one per phase span.

Rows are derived from RunEvents at ingest; RunEvent stays the source of truth.
"""

from django.db import models


class MetricPoint(models.Model):
    run = models.ForeignKey("jobs.Run", on_delete=models.CASCADE, related_name="metric_points")
    step = models.BigIntegerField()
    name = models.TextField()
    # NULL when the engine reported NaN or +-inf: JSON (and Postgres jsonb) cannot carry them.
    value = models.FloatField(null=True)

    class Meta:
        constraints = [
            # Also the index that loads a series: WHERE run = ? AND name = ? ORDER BY step.
            models.UniqueConstraint(fields=["run", "name", "step"], name="metric_point_unique"),
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.step} {self.name}={self.value}"


class PhaseSpan(models.Model):
    """A phase (rollout, reward, learner, weight_sync) busy on one logical device."""

    run = models.ForeignKey("jobs.Run", on_delete=models.CASCADE, related_name="phase_spans")
    device = models.TextField()
    phase = models.TextField()
    start = models.FloatField()  # unix seconds
    end = models.FloatField()
    step = models.BigIntegerField()
    version = models.BigIntegerField()

    class Meta:
        indexes = [models.Index(fields=["run", "step"], name="phase_span_run_step")]

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.step} {self.device} {self.phase}"


def latest_values(run_ids) -> dict[int, dict[str, tuple[int, float | None]]]:
    """{run id: {metric name: (step, value)}} at each metric's last reported step: the
    API's run detail and the Prometheus scrape read the same thing. The last step per
    (run, name) comes off the unique index; most names share a few last steps, so the
    rows are fetched by those steps and kept where they are their name's last."""
    last: dict[int, dict[str, int]] = {}
    for run_id, name, step in (
            MetricPoint.objects.filter(run_id__in=list(run_ids)).values("run_id", "name")
            .annotate(step=models.Max("step")).order_by()
            .values_list("run_id", "name", "step")):
        last.setdefault(run_id, {})[name] = step
    out: dict[int, dict[str, tuple[int, float | None]]] = {}
    for run_id, steps in last.items():
        rows = MetricPoint.objects.filter(run_id=run_id, step__in=set(steps.values()))
        out[run_id] = {name: (step, value) for name, step, value in
                       rows.values_list("name", "step", "value") if steps.get(name) == step}
    return out
