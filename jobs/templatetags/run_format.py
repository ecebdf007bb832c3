"""Run figures in templates: ``{{ seconds|duration }}`` -> "1h 02m", "4m 05s", "12s";
``{{ run.framework|framework_label }}`` -> "TRL", "veRL", "rlplane";
``{{ run|steps_trained }}`` -> the runs list's step column (Run.steps_done of its
annotated latest step)."""

from django import template

from engine.config import FRAMEWORK_LABELS

register = template.Library()


@register.filter
def duration(seconds) -> str:
    if seconds is None:
        return "–"
    total = int(round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


@register.filter
def framework_label(framework: str) -> str:
    return FRAMEWORK_LABELS.get(framework, framework)


@register.filter
def steps_trained(run) -> int | None:
    return run.steps_done(run.step)
