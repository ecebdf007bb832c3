"""Per-preset alert thresholds, edited by operators.

    GET  /presets/<id>/alerts    one field per Thresholds field: the preset's value, the
                                 default as placeholder, the field's docstring as help
    POST                         saves only the values that differ from the defaults;
                                 an out-of-range value comes back as that field's error
"""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from pydantic import ValidationError

from jobs.alerts.history import Thresholds
from jobs.auth import operator_required
from jobs.models import Preset


class ThresholdsForm(forms.Form):
    def __init__(self, *args, initial_values: dict, **kwargs):
        super().__init__(*args, **kwargs)
        for name, info in Thresholds.model_fields.items():
            field_cls = forms.IntegerField if info.annotation is int else forms.FloatField
            self.fields[name] = field_cls(
                required=False, help_text=info.description, initial=initial_values.get(name),
                widget=forms.NumberInput(attrs={"placeholder": info.default, "step": "any"}))

    def clean(self):
        values = {k: v for k, v in self.cleaned_data.items() if v is not None}
        try:
            thresholds = Thresholds(**values)
        except ValidationError as exc:
            for e in exc.errors():
                self.add_error(str(e["loc"][0]), e["msg"])
            return self.cleaned_data
        defaults = Thresholds()
        self.overrides = {k: v for k, v in thresholds.model_dump().items()
                          if v != getattr(defaults, k)}
        return self.cleaned_data


@operator_required
def preset_thresholds(request, preset_id: int):
    preset = get_object_or_404(Preset, pk=preset_id)
    form = ThresholdsForm(request.POST or None, initial_values=preset.alert_thresholds)
    if request.method == "POST" and form.is_valid():
        preset.alert_thresholds = form.overrides
        preset.save(update_fields=["alert_thresholds", "updated_at"])
        messages.success(request, f"alert thresholds of {preset.name} saved")
        return redirect("preset-thresholds", preset.pk)
    return render(request, "jobs/alerts/thresholds.html", {"preset": preset, "form": form})
