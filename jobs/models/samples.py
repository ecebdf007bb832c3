"""The rollout inspector's rows: the rollouts a run's ``samples`` events carried.

    samples event (step k) -> one InspectedSample per rollout, derived at ingest
    retention: a run keeps the samples of its last settings.RLPLANE_SAMPLE_STEPS steps

The RunEvent of a samples event keeps only its step and count (the rollouts live here,
bounded), so the event log does not grow with model text.
"""

from django.conf import settings
from django.db import models


class InspectedSample(models.Model):
    run = models.ForeignKey("jobs.Run", on_delete=models.CASCADE, related_name="samples")
    step = models.BigIntegerField()
    index = models.IntegerField()            # its place in the event (groups stay together)
    group = models.IntegerField()
    prompt = models.TextField()
    completion = models.TextField()
    reward = models.FloatField()
    reason = models.TextField()
    advantage = models.FloatField()
    version = models.BigIntegerField()
    last_version = models.BigIntegerField()
    staleness = models.BigIntegerField()
    length = models.IntegerField()
    truncated = models.BooleanField()
    # {"text": [...], "behaviour": [...], "learner": [...]}: parallel, one entry a token;
    # "turns", a multi-turn trajectory's only: its turns over them (RolloutSample.turns)
    tokens = models.JSONField()
    max_gap = models.FloatField(null=True)   # the largest |behaviour - learner| of a token

    class Meta:
        ordering = ["run", "step", "index"]
        constraints = [models.UniqueConstraint(fields=["run", "step", "index"],
                                               name="inspected_sample_unique")]

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.step} #{self.index} reward {self.reward}"

    @property
    def mixes_versions(self) -> bool:
        return self.version != self.last_version

    def as_dict(self) -> dict:
        return {"index": self.index, "group": self.group, "completion": self.completion,
                "reward": self.reward, "reason": self.reason, "advantage": self.advantage,
                "version": self.version, "last_version": self.last_version,
                "staleness": self.staleness, "length": self.length,
                "truncated": self.truncated, "mixes_versions": self.mixes_versions,
                "max_gap": self.max_gap, "tokens": self.tokens}

    @classmethod
    def keep_recent(cls, run) -> int:
        """Delete the run's samples older than its last RLPLANE_SAMPLE_STEPS sampled
        steps; how many rows went."""
        keep = settings.RLPLANE_SAMPLE_STEPS
        steps = (cls.objects.filter(run=run).order_by("-step").values_list("step", flat=True)
                 .distinct())
        oldest_kept = list(steps[keep - 1:keep])
        if not oldest_kept:
            return 0
        return cls.objects.filter(run=run, step__lt=oldest_kept[0]).delete()[0]


def max_gap(behaviour: list[float | None], learner: list[float | None]) -> float | None:
    gaps = [abs(b - x) for b, x in zip(behaviour, learner, strict=True)
            if b is not None and x is not None]
    return max(gaps, default=None)
