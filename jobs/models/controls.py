from django.conf import settings
from django.db import models

from engine.api import CONTROL_KINDS, CONTROL_VALUE_TYPES, control_label


class RunControl(models.Model):
    """A live control an operator asked of a running run (engine.controls): the driver
    polls the ones after the last id it received, applies each at a step boundary and
    reports it (control.applied), which fills ``applied_step`` / ``applied_at``."""

    run = models.ForeignKey("jobs.Run", on_delete=models.CASCADE, related_name="controls")
    kind = models.CharField(max_length=20, choices=[(k, k) for k in CONTROL_KINDS])
    value = models.FloatField(null=True, blank=True)  # the kinds in CONTROL_VALUE_TYPES
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                     on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    # The step the control took effect from, and when the driver reported it.
    applied_step = models.BigIntegerField(null=True, blank=True)
    applied_at = models.DateTimeField(null=True, blank=True)
    message = models.TextField(blank=True)  # the engine's word on what it did

    class Meta:
        ordering = ["run", "id"]

    def __str__(self) -> str:
        return f"run {self.run_id} control #{self.pk} {self.kind}"

    def as_engine_dict(self) -> dict:
        """What the driver's poll receives (engine.controls.validate_control reads it)."""
        data = {"id": self.pk, "kind": self.kind,
                "requested_by": self.requested_by.get_username() if self.requested_by else ""}
        if self.value is not None:
            data["value"] = CONTROL_VALUE_TYPES.get(self.kind, float)(self.value)
        return data

    @property
    def label(self) -> str:
        return control_label(self.kind, self.value)


def paused(run) -> bool:
    """Whether the run's driver is holding: the last pause or resume it applied was a
    pause, and the run is still running."""
    if run.status != "running":
        return False
    last = (RunControl.objects.filter(run=run, kind__in=["pause", "resume"])
            .exclude(applied_at=None).order_by("-id").first())  # applied in id order
    return last is not None and last.kind == "pause"


def display_status(run) -> str:
    """What the run's badge says: its status, or "paused" while the driver holds."""
    return "paused" if paused(run) else run.status
