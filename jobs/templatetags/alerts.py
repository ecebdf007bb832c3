"""Alert evidence in templates: a number formatted for reading, and the series that
triggered the alert as a small inline SVG chart (no script, so it survives a swap).

    {{ value|evidence_value }}      {% sparkline alert.evidence.series %}
"""

from django import template
from django.utils.html import format_html

register = template.Library()

WIDTH, HEIGHT, PAD = 240, 48, 3


@register.filter
def evidence_value(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value)
    return text if len(text) <= 24 else text[:21] + "..."


@register.simple_tag
def sparkline(series: dict | None) -> str:
    """The series {name, steps, values} as a polyline, step on x; last point marked."""
    if not series or len(series.get("values", [])) < 1:
        return ""
    steps, values = series["steps"], series["values"]
    x0, x1 = min(steps), max(steps)
    y0, y1 = min(values), max(values)

    def xy(step, value):
        x = PAD + (WIDTH - 2 * PAD) * ((step - x0) / (x1 - x0) if x1 > x0 else 0.5)
        y = HEIGHT - PAD - (HEIGHT - 2 * PAD) * ((value - y0) / (y1 - y0) if y1 > y0 else 0.5)
        return f"{x:.1f},{y:.1f}"

    points = " ".join(xy(s, v) for s, v in zip(steps, values, strict=True))
    last = xy(steps[-1], values[-1]).split(",")
    return format_html(
        '<figure class="sparkline"><svg viewBox="0 0 {} {}" width="{}" height="{}" role="img" '
        'aria-label="{}"><polyline fill="none" stroke="#0b4a9c" stroke-width="1.5" '
        'points="{}"/><circle cx="{}" cy="{}" r="2.5" fill="#9b1c1c"/></svg>'
        "<figcaption>{} (steps {}-{}: {} .. {})</figcaption></figure>",
        WIDTH, HEIGHT, WIDTH, HEIGHT, series["name"], points, last[0], last[1],
        series["name"], x0, x1, f"{y0:.4g}", f"{y1:.4g}")
