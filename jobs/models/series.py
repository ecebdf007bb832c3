"""What the run page charts: one row per (metric, step), one per phase span.

Rows are derived from RunEvents at ingest; RunEvent stays the source of truth.

The tables ingest writes at every batch (these three and RunEvent) keep no foreign key
constraint to their run (db_constraint=False): PostgreSQL checked one per row at commit,
about half of a raw COPY's time (bench/ingest.py: its COPY limit 117k -> 215k values/s,
ingest 42-45k -> 51-54k). Ingest stores rows only under the run's row lock, having found the
run there (jobs/ingest/store.py); deleting a run deletes its rows (Django's CASCADE, which
runs in Python either way).
"""

from django.db import models


class MetricPoint(models.Model):
    run = models.ForeignKey("jobs.Run", on_delete=models.CASCADE, related_name="metric_points",
                            db_constraint=False)
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

    run = models.ForeignKey("jobs.Run", on_delete=models.CASCADE, related_name="phase_spans",
                            db_constraint=False)
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


class MetricRollup(models.Model):
    """One bucket of a metric's steps at one tier: steps [bucket * width, (bucket + 1) *
    width). Kept as points arrive (jobs/rollups.py derive_rollups), so a long run's chart
    reads a few thousand of these instead of every point, and they outlive the raw points
    (RLPLANE_RAW_POINTS_RETENTION_DAYS). ``count``, ``total``, ``low`` and ``high`` are over
    the bucket's finite values (a NaN is stored as NULL and counted nowhere); ``last`` is
    the value at the bucket's highest step, NULL included."""

    run = models.ForeignKey("jobs.Run", on_delete=models.CASCADE, related_name="metric_rollups",
                            db_constraint=False)
    name = models.TextField()
    width = models.IntegerField()      # steps per bucket: one of jobs.rollups.TIERS
    bucket = models.BigIntegerField()  # step // width
    count = models.IntegerField()
    total = models.FloatField()
    low = models.FloatField(null=True)
    low_step = models.BigIntegerField(null=True)
    high = models.FloatField(null=True)
    high_step = models.BigIntegerField(null=True)
    last_step = models.BigIntegerField()
    last = models.FloatField(null=True)
    ts = models.FloatField(null=True)  # unix time the bucket's latest point was reported

    class Meta:
        constraints = [
            # Also the index a chart reads: WHERE run = ? AND width = ? AND name IN (...).
            models.UniqueConstraint(fields=["run", "width", "name", "bucket"],
                                    name="metric_rollup_unique"),
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} {self.name} steps {self.bucket * self.width}+{self.width}"
