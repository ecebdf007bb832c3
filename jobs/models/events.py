from pathlib import Path

from django.db import connection, models
from django.utils import timezone

from jobs.models.run import run_directory


class RunEvent(models.Model):
    """One engine event as it arrived. (run, seq) is the idempotency key of ingest and the
    order in which a reconnecting page is backfilled. Seqs below 0 are a launched
    command's Ray job log lines (line k at -k, jobs/runs/job_logs.py), outside the
    stream the run's process reports: backfill and highest_seq count seqs above 0."""

    run = models.ForeignKey("jobs.Run", on_delete=models.CASCADE, related_name="events",
                            db_constraint=False, db_index=False)
    seq = models.BigIntegerField()
    type = models.CharField(max_length=40)
    ts = models.FloatField()  # unix seconds, the engine's clock
    # event.to_dict(), non-finite numbers as null; a samples event's step and count only
    # (jobs.ingest.store.stored_payload: its rollouts are InspectedSample rows)
    payload = models.JSONField()

    class Meta:
        ordering = ["run", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="run_event_unique_seq")]
        # A run's events of one type, newest first (its logs, its replaced workers, when
        # its steps were reported): without it each reads every event of a 100k-step run.
        indexes = [models.Index(fields=["run", "type", "seq"], name="run_event_type_seq")]

    def __str__(self) -> str:
        return f"run {self.run_id} #{self.seq} {self.type}"

    @classmethod
    def backfill(cls, run, after_seq: int = 0):
        """The run's events after ``after_seq``, in seq order (whatever order they came in)."""
        return cls.objects.filter(run=run, seq__gt=after_seq).order_by("seq")

    @classmethod
    def highest_seq(cls, run) -> int:
        """The highest seq ``run``'s process reported, 0 when none. In SQL: ingest asks twice
        a batch, and the ORM's aggregate cost more to build than the index seek."""
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT MAX(seq) FROM {connection.ops.quote_name(cls._meta.db_table)}"
                           " WHERE run_id = %s AND seq > 0", [run.pk])
            return cursor.fetchone()[0] or 0


class Checkpoint(models.Model):
    """A checkpoint the driver finished writing; a fork starts from one."""

    run = models.ForeignKey("jobs.Run", on_delete=models.CASCADE, related_name="checkpoints")
    step = models.BigIntegerField()
    version = models.BigIntegerField()
    path = models.TextField()
    fingerprint = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["run", "step"]
        constraints = [
            models.UniqueConstraint(fields=["run", "step"], name="checkpoint_unique_step"),
        ]

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.step} ({self.path})"

    def directory(self) -> Path:
        """Where this checkpoint is, resolved by the control plane from (run, step) under
        the run's own directory. ``path`` is only what the driver said: a run token could
        have said anything there, so nothing is ever loaded from it."""
        return run_directory(self.run_id) / "checkpoints" / f"step_{self.step:06d}"

    def on_disk(self) -> bool:
        """Still there: a run keeps its last checkpoint.keep_last and deletes the rest."""
        return (self.directory() / "state.json").is_file()

    @classmethod
    def forkable(cls, run):
        """The run's checkpoints still on disk, newest first."""
        newest = run.checkpoints.order_by("-step")
        return newest.filter(pk__in=[c.pk for c in newest if c.on_disk()])
