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
