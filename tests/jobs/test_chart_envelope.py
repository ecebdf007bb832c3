"""The run page's first render of a long run: each chart thinned to its min/max envelope,
so no spike is lost and a band's edges keep the same steps."""

import math

import pytest

from jobs import charts

CHARTS = {chart.id: chart for chart in charts.METRIC_CHARTS}


def steps_of(n: int, spike_at: int | None = None) -> list[tuple[int, dict]]:
    out = []
    for step in range(1, n + 1):
        value = 0.5 + 0.1 * math.sin(step / 300)
        gap = 9.0 if step == spike_at else 0.01
        dip = -5.0 if step == (spike_at or 0) + 1 else value
        out.append((step, {"reward/mean": dip, "reward/std": 0.1, "logprob_gap/mean": gap,
                           "logprob_gap/max": gap}))
    return out


def figure(figures, chart_id):
    return next(f for f in figures if f["id"] == chart_id)


def test_a_short_run_is_drawn_whole_and_titled_as_it_is():
    steps = steps_of(500)
    fig = figure(charts.metric_figures(steps), "reward")
    assert [t["x"] for t in fig["traces"][:3]] == [list(range(1, 501))] * 3
    assert fig["layout"]["title"]["text"] == CHARTS["reward"].title


def test_a_long_run_is_thinned_but_keeps_its_spike_dip_and_both_ends():
    steps = steps_of(10_000, spike_at=7431)
    figures = charts.metric_figures(steps)
    for fig in figures:
        if fig["id"] == "timeline":
            continue
        for trace in fig["traces"]:
            assert len(trace["x"]) <= charts.RUN_POINTS
    gap = figure(figures, "logprob_gap")["traces"][0]
    assert max(gap["y"]) == 9.0 and gap["x"][gap["y"].index(9.0)] == 7431
    reward = figure(figures, "reward")
    mean = reward["traces"][2]
    assert min(mean["y"]) == -5.0 and mean["x"][mean["y"].index(-5.0)] == 7432
    assert mean["x"][0] == 1 and mean["x"][-1] == 10_000
    # The band's two edges and the mean share their steps, point by point.
    assert reward["traces"][0]["x"] == reward["traces"][1]["x"] == mean["x"]
    assert "10,000 steps" in reward["layout"]["title"]["text"]


def test_the_envelope_keeps_steps_in_order_without_repeats():
    kept = charts.envelope(CHARTS["reward"], steps_of(9_999, spike_at=5))
    xs = [step for step, _ in kept]
    assert xs == sorted(set(xs)) and len(xs) <= charts.RUN_POINTS


def test_the_reward_band_stops_at_the_steps_lowest_and_highest_reward():
    steps = [(0, {"reward/mean": 0.9, "reward/std": 0.3, "reward/min": 0.0, "reward/max": 1.0}),
             (1, {"reward/mean": 0.5, "reward/std": 0.1})]   # an older run: no min or max
    lower, upper, _, _ = figure(charts.metric_figures(steps), "reward")["traces"]
    assert lower["y"] == pytest.approx([0.6, 0.4]) and upper["y"] == pytest.approx([1.0, 0.6])


def test_the_timeline_lists_the_env_phase_only_for_a_run_with_an_environment():
    span = {"device": "cpu:0", "phase": "env", "start": 1.0, "end": 2.0}

    def env_trace(**kw):
        return next(t for t in charts.timeline_figure([span], **kw)["traces"]
                    if t["name"] == "env")

    assert env_trace()["showlegend"] is False and env_trace()["x"] == [1000.0]
    assert "showlegend" not in env_trace(multi_turn=True)
