from django.contrib import admin

from jobs.models import (
    Alert,
    AlertChannel,
    ApiToken,
    Checkpoint,
    MetricPoint,
    Notification,
    PhaseSpan,
    Preset,
    Run,
    RunEvent,
)


@admin.register(Preset)
class PresetAdmin(admin.ModelAdmin):
    list_display = ["name", "description", "updated_at"]
    search_fields = ["name"]


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "status", "priority", "created_by", "created_at",
                    "finished_at"]
    list_filter = ["status"]
    search_fields = ["name", "ray_submission_id"]
    raw_id_fields = ["parent"]
    # Status moves only through Run.transition_to; the token hash is never edited by hand.
    readonly_fields = ["status", "status_reason", "started_at", "finished_at",
                       "ingest_token_hash"]


class ReadOnlyAdmin(admin.ModelAdmin):
    """Shown, never written: a run's events are its record (what the engine reported,
    stored once by seq), and its metric points and spans are derived from them at ingest
    with its tiers, alert history and kept baselines (jobs.alerts). An edit here changed
    one table and none of what was derived from it; a run's rows go with the run."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(RunEvent)
class RunEventAdmin(ReadOnlyAdmin):
    list_display = ["run", "seq", "type", "ts"]
    list_filter = ["type"]
    raw_id_fields = ["run"]


@admin.register(MetricPoint)
class MetricPointAdmin(ReadOnlyAdmin):
    list_display = ["run", "step", "name", "value"]
    search_fields = ["name"]
    raw_id_fields = ["run"]


@admin.register(PhaseSpan)
class PhaseSpanAdmin(ReadOnlyAdmin):
    list_display = ["run", "step", "device", "phase", "start", "end", "version"]
    raw_id_fields = ["run"]


@admin.register(Checkpoint)
class CheckpointAdmin(admin.ModelAdmin):
    list_display = ["run", "step", "version", "path", "created_at"]
    raw_id_fields = ["run"]


@admin.register(Alert)
class AlertAdmin(admin.ModelAdmin):
    list_display = ["run", "kind", "state", "step", "opened_at", "resolved_at"]
    list_filter = ["state", "kind"]
    raw_id_fields = ["run"]
    # State moves only through Alert.acknowledge / resolve (conditional updates).
    readonly_fields = ["state", "acknowledged_at", "acknowledged_by", "resolved_at",
                       "resolved_by", "resolved_reason"]


@admin.register(AlertChannel)
class AlertChannelAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "target", "enabled"]


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin):
    list_display = ["alert", "channel", "event", "status", "attempts", "created_at"]
    list_filter = ["status"]
    raw_id_fields = ["alert"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Admins see and revoke anyone's tokens; the raw token exists only where it was shown."""

    list_display = ["name", "user", "hint", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["name", "user__username"]
    readonly_fields = ["user", "name", "hint", "created_at", "last_used_at"]
    exclude = ["token_hash"]
    actions = ["revoke"]

    def has_add_permission(self, request):
        return False  # a token is created by its owner, on /settings/tokens

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request, queryset):
        for token in queryset:
            token.revoke()
