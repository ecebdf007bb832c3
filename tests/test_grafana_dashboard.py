"""deploy/grafana/rlplane.json asks Prometheus only for what /metrics exports
(jobs/prometheus.py) and draws the canonical metrics (engine/metrics.py)."""

import json
import re
from pathlib import Path

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "rlplane.json"
EXPORTED = {"rlplane_run_metric", "rlplane_run_step", "rlplane_runs", "rlplane_queue_length",
            "rlplane_alerts", "rlplane_ingest_events_total", "rlplane_ingest_batches_total",
            "rlplane_ingest_seconds_bucket"}
CANONICAL = {"reward/mean", "eval/reward_mean", "bubble", "rollout_share", "staleness/mean",
             "staleness/max", "weight_sync/latency_s", "time/step_s"}


def expressions() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p["targets"]]


def test_every_query_names_a_family_that_metrics_exports():
    families = {name for expr in expressions()
                for name in re.findall(r"\b(rlplane_[a-z_]+)", expr)}
    assert families and families <= EXPORTED, families - EXPORTED


def test_the_canonical_panels_are_there():
    shown = {name for expr in expressions() for name in re.findall(r'name="([^"]+)"', expr)}
    assert CANONICAL <= shown, CANONICAL - shown


def test_every_metric_a_panel_queries_is_in_the_vocabulary():
    """A renamed metric would leave its panel empty without a word."""
    from engine.metrics import METRICS

    shown = {name for expr in expressions() for name in re.findall(r'name="([^"]+)"', expr)}
    assert shown <= set(METRICS), f"not canonical (engine/metrics.py): {shown - set(METRICS)}"


def test_panels_do_not_overlap():
    dashboard = json.loads(DASHBOARD.read_text())
    cells = set()
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, panel["title"]
        assert g["x"] + g["w"] <= 24
        cells |= mine
