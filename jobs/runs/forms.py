"""The run form: a TOML config validated by RunConfig, placement and async policy on top.

    algorithm    [grpo v]           one select per pluggable choice the operator changes
    placement    [colocated v]      between runs: a view of that table's ``type``
    async policy [sync v]
    config       [ TOML textarea ]  the one source of truth

The TOML decides. In the browser (static/js/run_form.js) a select shows the ``type`` the
TOML's table names when a config is pasted or loaded, and changing the select rewrites
that ``type`` line in the TOML, so what is launched is what the text says. The server
never overrides the TOML: a table without ``type`` takes the select's choice, and a
select that contradicts the TOML's ``type`` (a browser without scripts) is an error
naming both.

Every ConfigError (field path, message) becomes a ConfigProblem with the TOML line the
path maps to (jobs/runs/toml_lines.py); it is listed under the config at that line, and also
shown on the algorithm, placement or async policy select when the path starts there.
A fork also asks the parent whether the chosen checkpoint can start the new config
(Run.fork_problem: steps past the checkpoint's, and PPO from a run without a critic needs
algorithm.critic.path), and its review says how many steps it will train (``plan``).
"""

from __future__ import annotations

import difflib
import hashlib
import re
import tomllib
from dataclasses import dataclass

from django import forms

from engine.config import ConfigError, RunConfig, dump_config, union_choices, validate_config
from jobs.models import Checkpoint, Run
from jobs.runs.toml_lines import line_of
from jobs.untrusted import MAX_DEPTH, storable_problem

CHOICE_SECTIONS = ("algorithm", "placement", "async_policy")  # the choices at the top


def toml_table(text: str) -> dict:
    """A config's TOML text as a table; ConfigError at "(toml)" when it does not parse,
    at the field when a value cannot be stored (jobs.untrusted) (the form and the REST API
    say it the same way)."""
    try:
        table = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([("(toml)", f"not valid TOML: {exc}")]) from None
    except RecursionError:  # tomllib recurses per nested array or inline table
        raise ConfigError([("(toml)", f"nests deeper than {MAX_DEPTH} levels")]) from None
    problem = storable_problem(table)
    if problem is not None:
        raise ConfigError([problem])
    return table


@dataclass(frozen=True)
class ConfigProblem:
    """One bad field: its path, the fix, and where it sits in the operator's TOML."""
    path: str
    message: str
    line: int | None = None       # 1-based line of the TOML text, None when none maps
    text: str = ""                # that line, as written

    @classmethod
    def locate(cls, path: str, message: str, toml_text: str) -> ConfigProblem:
        line = line_of(toml_text, path)
        if path == "(toml)" and (m := re.search(r"at line (\d+)", message)):
            line = int(m.group(1))   # tomllib says where the text stops parsing
        lines = toml_text.splitlines()
        text = lines[line - 1].strip() if line and line <= len(lines) else ""
        return cls(path, message, line, text)


def initial_for(cfg: RunConfig) -> dict:
    return {"config": dump_config(cfg), **{s: getattr(cfg, s).type for s in CHOICE_SECTIONS}}


class RunConfigForm(forms.Form):
    algorithm = forms.ChoiceField(
        required=False, help_text="The RL objective: [algorithm] type (ppo adds a critic).")
    placement = forms.ChoiceField(
        required=False, help_text="Where rollout and learner run: [placement] type.")
    async_policy = forms.ChoiceField(
        required=False, label="Async policy",
        help_text="When rollouts run relative to learner updates: [async_policy] type.")
    config = forms.CharField(
        label="Config (TOML)",
        widget=forms.Textarea(attrs={"rows": 28, "cols": 90, "spellcheck": "false"}))

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for section in CHOICE_SECTIONS:
            self.fields[section].choices = [(t, t) for t in union_choices(section)]
            self.fields[section].widget.attrs["data-toml-table"] = section  # run_form.js
        self.run_config: RunConfig | None = None
        self.config_errors: list[ConfigProblem] = []  # in the order RunConfig reports them

    def clean(self):
        cleaned = super().clean()
        text = cleaned.get("config")
        if text is None:
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
                self._config_error(section, f"must be a table, e.g. [{section}]")
                return cleaned
            chosen = cleaned.get(section)
            if "type" not in table and chosen:
                table["type"] = chosen        # nothing written: the select's choice
            elif chosen and table["type"] != chosen:
                self._config_error(
                    f"{section}.type",
                    f"the TOML says type = {table['type']!r} but the {section} select says "
                    f"{chosen!r}: change one so they agree (the TOML is what launches)")
        if self.config_errors:
            return cleaned
        try:
            self.run_config = validate_config(data)
        except ConfigError as exc:
            for path, message in exc.errors:
                self._config_error(path, message)
        return cleaned

    def _config_error(self, path: str, message: str) -> None:
        self.config_errors.append(ConfigProblem.locate(path, message,
                                                       self.cleaned_data.get("config", "")))
        section = path.split(".")[0]
        self.add_error(section if section in CHOICE_SECTIONS else "config", f"{path}: {message}")

    def refuse(self, refused) -> None:
        """A launch the actions refused (jobs.runs.actions.Refused): its sentence at the
        field it names, as a validation error would be."""
        message = str(refused).removeprefix(f"{refused.field}: ") if refused.field else str(refused)
        self._config_error(refused.field or "config", message)
        self.run_config = None

    def config_data(self) -> dict:
        return self.run_config.model_dump(mode="json")


class ForkForm(RunConfigForm):
    """The run form plus the parent's checkpoint to start from. Launching takes a second
    submit: the first shows the diff against the parent and records which config was
    reviewed (``reviewed``); a config changed after the review is shown again."""

    field_order = ["checkpoint", "algorithm", "placement", "async_policy", "config"]

    checkpoint = forms.ModelChoiceField(queryset=Checkpoint.objects.none(), empty_label=None,
                                        help_text="The fork starts from these weights.")
    reviewed = forms.CharField(required=False, widget=forms.HiddenInput)

    def __init__(self, parent: Run, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.parent = parent
        self.fields["checkpoint"].queryset = Checkpoint.forkable(parent)
        self.fields["checkpoint"].label_from_instance = (
            lambda c: f"step {c.step} (version {c.version})")

    def clean(self):
        cleaned = super().clean()
        checkpoint = cleaned.get("checkpoint")
        if self.run_config is not None:
            problem = self.parent.fork_problem(self.run_config.model_dump(mode="json"),
                                               checkpoint.step if checkpoint else None)
            if problem is not None:
                self._config_error(*problem)
                self.run_config = None
        return cleaned

    def plan(self) -> str:
        """What the fork will do, for its review: "trains 5 more steps (4 -> 9)"."""
        start, end = self.cleaned_data["checkpoint"].step, self.run_config.steps
        return (f"Trains {end - start} more step{'s' if end - start != 1 else ''}: from "
                f"run #{self.parent.pk}'s checkpoint at step {start} to step {end}.")

    def digest(self) -> str:
        return hashlib.sha256(dump_config(self.run_config).encode()).hexdigest()[:16]

    def is_reviewed(self) -> bool:
        return self.cleaned_data.get("reviewed") == self.digest()

    def diff(self) -> str:
        return config_diff(self.parent, self.run_config)


def config_diff(parent: Run, cfg: RunConfig) -> str:
    """Unified diff of the parent's TOML against the new config's ('' when equal)."""
    before = dump_config(parent.run_config).splitlines()
    after = dump_config(cfg).splitlines()
    return "\n".join(difflib.unified_diff(before, after, f"run #{parent.pk} ({parent.name})",
                                          "fork", lineterm=""))
