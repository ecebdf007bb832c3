"""What the API reads and writes. Output shapes are plain serializers over the models, so
the OpenAPI schema names every field; run configs stay the engine's RunConfig as JSON."""

from rest_framework import serializers

from engine.api import CONTROL_KINDS
from jobs.models import Alert, Checkpoint, Preset, Run, RunControl
from jobs.models.run import PRIORITY_BOUND


class RunSerializer(serializers.ModelSerializer):
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True,
                                              allow_null=True)
    archived = serializers.SerializerMethodField()
    framework = serializers.CharField(
        read_only=True, help_text='who trains the run: "rlplane" (its own engine) or the '
                                  'external framework ("trl", "verl", ...)')

    class Meta:
        model = Run
        fields = ["id", "name", "framework", "status", "status_reason", "priority", "parent",
                  "baseline_run", "source_checkpoint", "created_by", "created_at",
                  "started_at", "finished_at", "archived"]
        extra_kwargs = {"baseline_run": {"help_text": (
            "the run ThroughputRegression compares with, marked by an operator (POST "
            ".../baseline); null: the parent's first steps for a fork, else its own")}}

    def get_archived(self, run) -> bool:
        return run.archived_at is not None


class LatestMetricSerializer(serializers.Serializer):
    step = serializers.IntegerField()
    value = serializers.FloatField(allow_null=True)


class AlertSerializer(serializers.ModelSerializer):
    run_name = serializers.CharField(source="run.name", read_only=True)

    class Meta:
        model = Alert
        fields = ["id", "run", "run_name", "kind", "state", "cause", "runbook", "evidence",
                  "step", "last_step", "opened_at", "acknowledged_at", "resolved_at",
                  "resolved_reason"]


class DriverRestartSerializer(serializers.Serializer):
    at = serializers.CharField(help_text="when the driver was submitted again (ISO 8601)")
    cause = serializers.CharField(help_text="why the driver before it ended")
    job = serializers.CharField(help_text="the Ray job that ended")
    step = serializers.IntegerField(allow_null=True,
                                    help_text="the last step stored when it ended")


class RunDetailSerializer(RunSerializer):
    latest = serializers.DictField(child=LatestMetricSerializer(), read_only=True,
                                   help_text="each metric at its last reported step")
    restarts = DriverRestartSerializer(
        many=True, read_only=True, help_text="the driver's restarts (the config's "
        "max_restarts), oldest first: each resumed from the latest checkpoint")
    open_alerts = AlertSerializer(many=True, read_only=True)
    paused = serializers.BooleanField(read_only=True,
                                      help_text="the driver holds after a pause control")

    class Meta(RunSerializer.Meta):
        fields = [*RunSerializer.Meta.fields, "config", "latest", "open_alerts", "paused",
                  "restarts"]


class ConfigInput(serializers.Serializer):
    """A run config: TOML text (as in configs/) or the same as a JSON object; not both."""

    toml = serializers.CharField(required=False, trim_whitespace=False, min_length=1)
    config = serializers.DictField(required=False)

    def validate(self, attrs):
        if ("toml" in attrs) == ("config" in attrs):
            raise serializers.ValidationError({"toml": "send either toml or config"})
        return attrs


class LaunchSerializer(ConfigInput):
    priority = serializers.IntegerField(default=0, min_value=-PRIORITY_BOUND,
                                        max_value=PRIORITY_BOUND)


class ExternalLaunchSerializer(serializers.Serializer):
    """An external run: {"framework", "name", "params"?, "launch"?} (engine.config's
    ExternalRunConfig; its field errors come back with their paths)."""

    config = serializers.DictField(help_text='{"name": ..., "framework": "trl" | "verl" | '
                                   '"openrlhf" | "prime-rl" | "script", "params": {...}, '
                                   '"launch": null | {"entrypoint": ..., ...}}')
    priority = serializers.IntegerField(default=0, min_value=-PRIORITY_BOUND,
                                        max_value=PRIORITY_BOUND)


class ExternalRunSerializer(serializers.Serializer):
    run = RunDetailSerializer()
    token = serializers.CharField(
        allow_null=True, help_text="the run's ingest token, shown only here (null for a "
                                   "launched run: its command gets one in RLPLANE_TOKEN)")
    ingest_url = serializers.CharField(help_text="where the run's process reports "
                                       "(rlplane.track's url)")


class ForkSerializer(ConfigInput):
    """A fork: the parent's config (renamed "<name>-fork") with the changes given as
    ``toml`` or ``config`` laid over it table by table, so {"config": {"steps": 9}}
    changes the steps only and {"config": {}} is the parent's config; a table whose
    ``type`` changes is replaced whole."""

    checkpoint = serializers.IntegerField(
        required=False, min_value=0, max_value=2**63 - 1,
        help_text="a checkpoint id of the parent; default: its latest")
    priority = serializers.IntegerField(default=0, min_value=-PRIORITY_BOUND,
                                        max_value=PRIORITY_BOUND)

    def validate(self, attrs):  # the config may be left out: the parent's, renamed
        if "toml" in attrs and "config" in attrs:
            raise serializers.ValidationError({"toml": "send either toml or config"})
        return attrs


class BaselineSerializer(serializers.Serializer):
    baseline_run = serializers.IntegerField(
        allow_null=True, min_value=0, max_value=2**63 - 1,
        help_text="a run id whose timed steps (after its first) become this run's "
                  "throughput baseline; null clears the mark")


class PrioritySerializer(serializers.Serializer):
    priority = serializers.IntegerField(min_value=-PRIORITY_BOUND, max_value=PRIORITY_BOUND)


class ControlRequestSerializer(serializers.Serializer):
    """A live control for a running run; engine.controls validates the value per kind."""

    kind = serializers.ChoiceField(choices=CONTROL_KINDS)
    value = serializers.FloatField(
        required=False, allow_null=True,
        help_text="set_lr: the learning rate (0 < lr <= 1); set_eval_every: steps "
                  "(an integer >= 0, 0 = no mid-run eval); set_rollout_workers: rollout "
                  "workers (an integer >= 1; a run on Ray with a point-to-point weight "
                  "sync); none for the others")

    def validate(self, attrs):
        unknown = sorted(set(self.initial_data) - set(self.fields))
        if unknown:  # the schema says additionalProperties: false (engine.api.Control)
            raise serializers.ValidationError({unknown[0]: "not a field of a control; "
                                               "send kind and, for some kinds, value"})
        return attrs


class ControlSerializer(serializers.ModelSerializer):
    requested_by = serializers.SlugRelatedField(slug_field="username", read_only=True,
                                                allow_null=True)

    class Meta:
        model = RunControl
        fields = ["id", "run", "kind", "value", "requested_by", "created_at",
                  "applied_step", "applied_at", "message"]


class CheckpointSerializer(serializers.ModelSerializer):
    class Meta:
        model = Checkpoint
        fields = ["id", "run", "step", "version", "path", "fingerprint", "created_at"]


class PresetSerializer(serializers.ModelSerializer):
    class Meta:
        model = Preset
        fields = ["id", "name", "description", "config", "alert_thresholds", "updated_at"]


class SeriesSerializer(serializers.Serializer):
    steps = serializers.ListField(child=serializers.IntegerField())
    values = serializers.ListField(child=serializers.FloatField(allow_null=True))


class MetricsSerializer(serializers.Serializer):
    series = serializers.DictField(child=SeriesSerializer())


class EventsSerializer(serializers.Serializer):
    events = serializers.ListField(child=serializers.DictField())
    last_seq = serializers.IntegerField(help_text="pass as after_seq to read on")


class JobLogLineSerializer(serializers.Serializer):
    line = serializers.IntegerField(help_text="its number in the job's log, from 1")
    ts = serializers.FloatField(help_text="when the control plane read it (unix seconds)")
    message = serializers.CharField()


class JobLogSerializer(serializers.Serializer):
    lines = JobLogLineSerializer(many=True)
    last_line = serializers.IntegerField(help_text="pass as after_line to read on")


class FieldErrorSerializer(serializers.Serializer):
    field = serializers.CharField(help_text='the field\'s path, e.g. "rollout.temperature"')
    message = serializers.CharField(help_text="what is wrong and the fix")


class ErrorSerializer(serializers.Serializer):
    """Every error the API answers (jobs/rest/errors.py)."""

    detail = serializers.CharField()
    errors = FieldErrorSerializer(many=True, required=False)
