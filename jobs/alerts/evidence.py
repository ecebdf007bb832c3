"""What every rule's evidence is made of: a chart-sized series, and a least-squares slope.

    chart(h, "reward/mean")   -> {"name", "steps": [...], "values": [...]}  (last 30 points)
    slope([(0, 1.0), (1, 3.0)])  -> 2.0
"""

from __future__ import annotations

import statistics

from jobs.alerts.history import RunHistory

CHART_POINTS = 30  # points of a series kept as evidence


def chart(h: RunHistory, name: str) -> dict:
    pts = h.last(name, CHART_POINTS)
    return {"name": name, "steps": [s for s, _ in pts], "values": [v for _, v in pts]}


def slope(points: list[tuple[int, float]]) -> float:
    """Least-squares slope of value over step."""
    xs, ys = [s for s, _ in points], [v for _, v in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
