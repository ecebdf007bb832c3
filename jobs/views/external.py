"""The new-run page's second door: a run another framework trains (TRL, veRL, OpenRLHF,
prime-rl, any script), which rlplane watches.

    GET  /runs/new/external     the form: name, framework, params (TOML or JSON), and an
                                optional command to launch as a Ray Job
    POST /runs/new/external     valid -> do_create_external_run; a run that reports from
                                its own process gets its ingest token shown ONCE, with the
                                environment lines to paste; a launched one -> its page
                                (the queue hands the token to the command itself)
"""

from __future__ import annotations

import json
import tomllib

from django import forms
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from engine.config import FRAMEWORK_LABELS, FRAMEWORKS, ConfigError, validate_external
from jobs.auth import operator_required
from jobs.runs.actions import do_create_external_run


class ExternalRunForm(forms.Form):
    name = forms.CharField(max_length=100, initial="run")
    framework = forms.ChoiceField(choices=[(f, FRAMEWORK_LABELS[f]) for f in FRAMEWORKS])
    params = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 6, "spellcheck": "false"}),
        help_text="The run's own parameters, as TOML (learning_rate = 1e-6) or a JSON "
                  "object; shown on the run page and in compare. A temperature or "
                  "max_async_level here lets the alerts that need it run.")
    entrypoint = forms.CharField(
        required=False, max_length=4096,
        help_text="Leave empty if the process runs elsewhere and reports by itself; "
                  "else the command rlplane starts as a Ray Job, e.g. python train.py")
    working_dir = forms.CharField(required=False, max_length=4096)
    env = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}),
                          help_text="NAME=value, one per line")
    pip = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 2}),
                          help_text="one package per line")
    gpus = forms.IntegerField(required=False, min_value=0, initial=0)
    cpus = forms.FloatField(required=False, min_value=0.0, initial=1.0)

    RUN_FIELDS = ("name", "framework", "params")

    def run_fields(self) -> list:
        return [self[name] for name in self.RUN_FIELDS]

    def launch_fields(self) -> list:
        return [self[name] for name in self.fields if name not in self.RUN_FIELDS]

    def clean_params(self) -> dict:
        text = self.cleaned_data["params"].strip()
        if not text:
            return {}
        try:
            value = json.loads(text) if text.startswith("{") else tomllib.loads(text)
        except (ValueError, tomllib.TOMLDecodeError) as exc:
            raise forms.ValidationError(f"neither a JSON object nor TOML: {exc}") from None
        return value

    def clean_env(self) -> dict[str, str]:
        env = {}
        for number, line in enumerate(self.cleaned_data["env"].splitlines(), start=1):
            if not line.strip():
                continue
            name, sep, value = line.partition("=")
            if not sep:
                raise forms.ValidationError(f"line {number}: write NAME=value")
            env[name.strip()] = value
        return env

    def config(self) -> dict:
        """The ExternalRunConfig as the action takes it (call after is_valid)."""
        data = self.cleaned_data
        config = {"name": data["name"], "framework": data["framework"], "params": data["params"]}
        if data["entrypoint"].strip():
            config["launch"] = {
                "entrypoint": data["entrypoint"].strip(),
                "working_dir": data["working_dir"].strip() or None, "env": data["env"],
                "pip": [p.strip() for p in data["pip"].splitlines() if p.strip()],
                "gpus": data["gpus"] or 0,
                "cpus": data["cpus"] if data["cpus"] is not None else 1.0}
        return config

    def validated(self) -> dict | None:
        """The config, validated; None with each bad field's error on the form."""
        config = self.config()
        try:
            return validate_external(config).model_dump(mode="json")
        except ConfigError as exc:
            for path, message in exc.errors:
                field = path.split(".")[-1] if path.startswith("launch.") else path
                self.add_error(field if field in self.fields else None,
                               f"{path}: {message}")
            return None


def connection_lines(request, run_id: int, token: str) -> list[str]:
    """What the user's process needs, as shell environment lines: rlplane.track and the
    adapters read RLPLANE_*, an MLflow logger the MLFLOW_TRACKING_* pair."""
    url = request.build_absolute_uri("/").rstrip("/")
    return [f"RLPLANE_URL={url}", f"RLPLANE_RUN_ID={run_id}", f"RLPLANE_TOKEN={token}",
            f"MLFLOW_TRACKING_URI={url}/mlflow", f"MLFLOW_TRACKING_TOKEN={token}"]


@operator_required
@require_http_methods(["GET", "POST"])
def run_new_external(request):
    form = ExternalRunForm(request.POST or None)
    if request.method == "POST" and form.is_valid() and (config := form.validated()):
        run, token = do_create_external_run(request.user, config)
        if token is None:           # launched: the queue gives the command its token
            return redirect("run-detail", run_id=run.pk)
        response = render(request, "jobs/launch/external_created.html", {
            "run": run, "lines": connection_lines(request, run.pk, token)})
        response["Cache-Control"] = "no-store"     # the token is shown this once
        return response
    return render(request, "jobs/launch/new_external.html", {"form": form})
