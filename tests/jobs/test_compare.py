"""Run compare: the summary figures from known series, the selection, the page and its JSON."""

import json

import pytest

from jobs.ingest.store import do_ingest_events
from jobs.models import Run
from jobs.queries.compare import (
    CompareError,
    config_differences,
    parse_ids,
    parse_level,
    percentile,
    since_start,
    summarize,
)

from .helpers import metrics

SERIES = {
    "throughput/samples_per_s": [(1, 10.0), (2, 20.0), (3, 30.0)],
    "throughput/tokens_per_s": [(1, 100.0), (2, None), (3, 300.0)],
    "bubble": [(1, 0.5), (2, 0.3), (3, 0.1)],
    "rollout_share": [(1, 0.8), (2, 0.6), (3, 0.7)],
    "staleness/mean": [(1, 0.0), (2, 1.0), (3, 2.0)],
    "staleness/max": [(1, 0.0), (2, 3.0), (3, 2.0)],
    "weight_sync/latency_s": [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 5.0)],
    "reward/mean": [(1, 0.1), (2, 0.4), (3, 0.6), (4, 0.5), (5, 0.9)],
    "eval/reward_mean": [(2, 0.3), (4, 0.7), (5, 0.6)],
}
WALL = {1: 0.0, 2: 1.5, 3: 3.0, 4: 4.5, 5: 6.0}


def test_the_summary_of_known_series():
    row = summarize(SERIES, WALL, level=0.5)

    assert row["steps"] == 5
    assert row["samples_per_s"] == pytest.approx(20.0)
    assert row["tokens_per_s"] == pytest.approx(200.0)  # the missing step is not a zero
    assert row["bubble"] == pytest.approx(0.3)
    assert row["rollout_share"] == pytest.approx(0.7)
    assert row["staleness_mean"] == pytest.approx(1.0)
    assert row["staleness_max"] == 3.0
    assert row["resync_p50_s"] == pytest.approx(3.0)
    assert row["resync_p99_s"] == pytest.approx(4.96)   # 4 + 0.96 * (5 - 4)
    assert row["held_out_final"] == 0.6 and row["held_out_best"] == 0.7
    assert row["reach_step"] == 3 and row["reach_s"] == 3.0
    assert row["reach_held_out_step"] == 4 and row["reach_held_out_s"] == 4.5


def test_a_level_never_reached_and_no_level_leave_the_time_empty():
    assert summarize(SERIES, WALL, level=0.95)["reach_step"] is None
    row = summarize(SERIES, WALL, level=None)
    assert row["reach_step"] is None and row["reach_s"] is None


def test_a_run_that_reported_nothing_has_an_empty_summary():
    row = summarize({}, {}, level=0.5)

    assert row["steps"] == 0
    assert all(v is None for k, v in row.items() if k != "steps")


def test_percentiles_interpolate_between_ranks_like_numpy():
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([1.0, 2.0], 99) == pytest.approx(1.99)
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


def test_wall_time_counts_from_the_first_reported_step():
    assert since_start({3: 110.0, 1: 100.0, 2: 104.5}) == {1: 0.0, 2: 4.5, 3: 10.0}
    assert since_start({}) == {}


@pytest.mark.parametrize("values, ids", [
    (["3,7"], [3, 7]), (["3", "7"], [3, 7]), (["7, 3, 7"], [7, 3]), (["1,2,3,4,5,6"],
                                                                     [1, 2, 3, 4, 5, 6]),
])
def test_the_selection_keeps_the_order_asked(values, ids):
    assert parse_ids(values) == ids


@pytest.mark.parametrize("values, says", [
    (["3"], "compare 2 to 6 runs, got 1"), ([""], "got 0"),
    (["1,2,3,4,5,6,7"], "got 7"), (["3,x"], "'x' is not a run id"), (["3,²"], "not a run id"),
])
def test_a_bad_selection_says_what_to_give(values, says):
    with pytest.raises(CompareError, match=says):
        parse_ids(values)


def test_the_level_is_a_finite_number_or_nothing():
    assert parse_level("0.5") == 0.5 and parse_level("") is None and parse_level(None) is None
    for bad in ("high", "nan", "inf"):
        with pytest.raises(CompareError, match="level"):
            parse_level(bad)


def test_config_differences_list_only_the_keys_that_differ():
    a = {"name": "a", "steps": 10, "placement": {"type": "colocated", "devices": 1}}
    b = {"name": "b", "steps": 10, "placement": {"type": "disaggregated", "devices": 1,
                                                 "rollout_workers": 1}}

    assert config_differences([a, b]) == [
        ("name", ["a", "b"]), ("placement.rollout_workers", [None, 1]),
        ("placement.type", ["colocated", "disaggregated"])]
    assert config_differences([a, a]) == []


# --- the page and its JSON -----------------------------------------------------------------

@pytest.fixture
def two_runs(make_run):
    parent = make_run(name="colocated", status="stopped")
    fork = Run.objects.create(name="async", parent=parent, config={
        "name": "t", "steps": 3, "async_policy": {"type": "one_step_off"}})
    for run, rewards in ((parent, (0.1, 0.2, 0.3)), (fork, (0.2, 0.6, 0.8))):
        do_ingest_events(run, [
            metrics(i + 1, i + 1, **{"reward/mean": r, "weight_sync/latency_s": 0.5 * (i + 1),
                                     "throughput/samples_per_s": 4.0})
            for i, r in enumerate(rewards)])
    return parent, fork


def compare_json(response) -> dict:
    html, marker = response.content.decode(), '<script id="compare-data" type="application/json">'
    start = html.index(marker) + len(marker)
    return json.loads(html[start:html.index("</script>", start)])


def test_the_compare_page_overlays_a_trace_per_run_in_every_chart(client, admin_user, two_runs):
    client.force_login(admin_user)
    parent, fork = two_runs

    response = client.get(f"/runs/compare?ids={parent.pk},{fork.pk}&level=0.5")

    assert response.status_code == 200
    data = compare_json(response)
    reward = next(c for c in data["charts"] if c["metric"] == "reward/mean")
    assert [t["name"] for t in reward["traces"]] == [f"#{parent.pk} colocated",
                                                     f"#{fork.pk} async"]
    assert [t["y"] for t in reward["traces"]] == [[0.1, 0.2, 0.3], [0.2, 0.6, 0.8]]
    assert all(len(c["traces"]) == 2 and len(c["wall"]) == 2 for c in data["charts"])
    assert reward["wall"][0] == [0.0, 1.0, 2.0]  # helpers.metrics: ts = 1000 + seq
    html = response.content.decode()
    assert 'id="compare-summary"' in html and "js/compare_charts.js" in html
    assert "async_policy.type" in html and "one_step_off" in html
    by_id = {r["id"]: r["summary"] for r in data["runs"]}
    assert by_id[fork.pk]["reach_step"] == 2 and by_id[parent.pk]["reach_step"] is None
    assert by_id[fork.pk]["resync_p50_s"] == pytest.approx(1.0)


def test_the_json_endpoint_returns_what_the_page_draws(client, admin_user, two_runs):
    client.force_login(admin_user)
    parent, fork = two_runs
    url = f"?ids={parent.pk},{fork.pk}&level=0.5"

    api = client.get("/api/runs/compare" + url).json()

    assert api == compare_json(client.get("/runs/compare" + url))
    assert client.get("/api/v1/runs/compare" + url).json() == api
    assert [r["parent_id"] for r in api["runs"]] == [None, parent.pk]


def test_checkbox_ids_are_redirected_to_one_shareable_list(client, admin_user, two_runs):
    client.force_login(admin_user)
    parent, fork = two_runs

    response = client.get(f"/runs/compare?ids={parent.pk}&ids={fork.pk}&level=0.5")

    assert response.status_code == 302
    assert response["Location"] == f"/runs/compare?ids={parent.pk},{fork.pk}&level=0.5"


def test_a_bad_selection_is_a_400_naming_the_field(client, admin_user, two_runs):
    client.force_login(admin_user)
    parent, _ = two_runs

    page = client.get(f"/runs/compare?ids={parent.pk},999")
    api = client.get(f"/api/runs/compare?ids={parent.pk}&level=x")

    assert page.status_code == 400 and "no run 999" in page.content.decode()
    assert api.status_code == 400
    assert api.json()["errors"] == [{"field": "ids", "message": "compare 2 to 6 runs, got 1; "
                                     "select them on the runs list, e.g. ?ids=3,7"}]


def test_a_fork_page_links_to_compare_with_its_parent(client, admin_user, two_runs):
    client.force_login(admin_user)
    parent, fork = two_runs

    html = client.get(f"/runs/{fork.pk}").content.decode()

    assert f'href="/runs/compare?ids={parent.pk},{fork.pk}"' in html
