"""The run form: a TOML config validated by RunConfig, placement and async policy on top.

    placement    [colocated v]      one select per pluggable choice the operator changes
    async policy [sync v]           between runs; the select sets that table's ``type``
    config       [ TOML textarea ]  everything else

Every ConfigError (field path, message) becomes a form error: on the placement or async
policy select when the path starts there, else on the config, listed with its path.
"""

from __future__ import annotations

import difflib
import hashlib
import tomllib

from django import forms

from engine.config import ConfigError, RunConfig, dump_config, union_choices, validate_config
from jobs.models import Checkpoint, Run

CHOICE_SECTIONS = ("placement", "async_policy")  # the explicit choices at the top


def toml_table(text: str) -> dict:
    """A config's TOML text as a table; ConfigError at "(toml)" when it does not parse
    (the form and the REST API say it the same way)."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([("(toml)", f"not valid TOML: {exc}")]) from None


def initial_for(cfg: RunConfig) -> dict:
    return {"config": dump_config(cfg), **{s: getattr(cfg, s).type for s in CHOICE_SECTIONS}}


class RunConfigForm(forms.Form):
    placement = forms.ChoiceField(
        help_text="Where rollout and learner run.")
    async_policy = forms.ChoiceField(
        label="Async policy", help_text="When rollouts run relative to learner updates.")
    config = forms.CharField(
        label="Config (TOML)",
        widget=forms.Textarea(attrs={"rows": 28, "cols": 90, "spellcheck": "false"}))

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for section in CHOICE_SECTIONS:
            self.fields[section].choices = [(t, t) for t in union_choices(section)]
        self.run_config: RunConfig | None = None
        self.config_errors: list[tuple[str, str]] = []  # (field path, message), in order

    def clean(self):
        cleaned = super().clean()
        text = cleaned.get("config")
        if text is None or any(s not in cleaned for s in CHOICE_SECTIONS):
            return cleaned
        try:
            data = toml_table(text)
        except ConfigError as exc:
            for path, message in exc.errors:
                self._config_error(path, message)
            return cleaned
        for section in CHOICE_SECTIONS:
            table = data.setdefault(section, {})
            if not isinstance(table, dict):
                self._config_error(section, "must be a table, e.g. [placement]")
                return cleaned
            table["type"] = cleaned[section]  # the select is the one place to choose it
        try:
            self.run_config = validate_config(data)
        except ConfigError as exc:
            for path, message in exc.errors:
                self._config_error(path, message)
        return cleaned

    def _config_error(self, path: str, message: str) -> None:
        self.config_errors.append((path, message))
        section = path.split(".")[0]
        self.add_error(section if section in CHOICE_SECTIONS else "config", f"{path}: {message}")

    def config_data(self) -> dict:
        return self.run_config.model_dump(mode="json")


class ForkForm(RunConfigForm):
    """The run form plus the parent's checkpoint to start from. Launching takes a second
    submit: the first shows the diff against the parent and records which config was
    reviewed (``reviewed``); a config changed after the review is shown again."""

    field_order = ["checkpoint", "placement", "async_policy", "config"]

    checkpoint = forms.ModelChoiceField(queryset=Checkpoint.objects.none(), empty_label=None,
                                        help_text="The fork starts from these weights.")
    reviewed = forms.CharField(required=False, widget=forms.HiddenInput)

    def __init__(self, parent: Run, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.parent = parent
        self.fields["checkpoint"].queryset = Checkpoint.forkable(parent)
        self.fields["checkpoint"].label_from_instance = (
            lambda c: f"step {c.step} (version {c.version})")

    def digest(self) -> str:
        return hashlib.sha256(dump_config(self.run_config).encode()).hexdigest()[:16]

    def is_reviewed(self) -> bool:
        return self.cleaned_data.get("reviewed") == self.digest()

    def diff(self) -> str:
        return config_diff(self.parent, self.run_config)


def config_diff(parent: Run, cfg: RunConfig) -> str:
    """Unified diff of the parent's TOML against the new config's ('' when equal)."""
    before = dump_config(validate_config(parent.config, check_files=False)).splitlines()
    after = dump_config(cfg).splitlines()
    return "\n".join(difflib.unified_diff(before, after, f"run #{parent.pk} ({parent.name})",
                                          "fork", lineterm=""))
