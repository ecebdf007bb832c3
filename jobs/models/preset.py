from django.db import models

from jobs.models.validators import (
    normalized_config,
    validate_alert_thresholds,
    validate_run_config,
)


class Preset(models.Model):
    """A named RunConfig that the new-run form starts from."""

    name = models.CharField(max_length=100, unique=True)
    config = models.JSONField(validators=[validate_run_config])
    description = models.TextField(blank=True)
    # Overrides of jobs.alerts.history.Thresholds for runs of this preset (same name).
    alert_thresholds = models.JSONField(default=dict, blank=True,
                                        validators=[validate_alert_thresholds])
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def save(self, *args, **kwargs):
        self.config = normalized_config(self.config)
        super().save(*args, **kwargs)
