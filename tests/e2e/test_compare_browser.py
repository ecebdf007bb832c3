"""End to end in a real browser: compare a run with its fork.

    log in -> launch a run from the form -> (its steps, read from the REST API) -> stop
    -> fork it from its checkpoint with another async policy (review the diff, launch)
    -> (a few steps) -> stop -> the fork's page: its header, its charts against wall time
    -> Compare with parent -> both runs' traces
    in every chart, by step and by wall time (screenshot: artifacts/compare.png)

A live run page redraws every chart at each step; on a loaded box that starves the
browser's renderer, so while a run streams the test waits on about:blank and follows the
run through the API instead. The pages it drives are the launch and fork forms, the
finished fork's page and the compare page.
"""

from __future__ import annotations

import re
import time

import pytest

from .test_browser import (  # noqa: F401 (fixtures)
    ARTIFACTS,
    RUN_TOML,
    browser,
    browser_page,
    log_in,
    stack,
    stop_by_request,
)

COMPARE_TOML = RUN_TOML.replace('name = "e2e-browser"', 'name = "e2e-compare"')


def last_step(page, base: str, run_id: str) -> int:
    """The run's last reported step (its time/step_s), through the REST API (-1: none)."""
    latest = page.request.get(f"{base}/api/v1/runs/{run_id}").json()["latest"]
    return latest["time/step_s"]["step"] if "time/step_s" in latest else -1


def wait_for_steps(page, base: str, run_id: str, more: int, deadline_s: float) -> list[int]:
    """Wait on a blank page until the run has reported ``more`` steps past its first."""
    page.goto("about:blank")
    deadline, seen = time.monotonic() + deadline_s, []
    while True:
        step = last_step(page, base, run_id)
        if step >= 0 and (not seen or seen[-1] != step):
            seen.append(step)
        if seen and seen[-1] - seen[0] >= more:
            return seen
        assert time.monotonic() < deadline, f"run {run_id} reached only {seen} in {deadline_s}s"
        time.sleep(1)


def trace_points(page) -> dict[str, list[int]]:
    """Per compare chart (its metric), the points of each trace as Plotly holds them."""
    return page.evaluate("""() => {
        const data = JSON.parse(document.getElementById("compare-data").textContent);
        const out = {};
        for (const fig of data.charts) {
            const div = document.getElementById("chart-" + fig.id);
            out[fig.metric] = (div.data || []).map(t => t.x.filter(x => x !== null).length);
        }
        return out;
    }""")


def run_page_wall_axis(page) -> None:
    """The run page's switch redraws the reward chart's traces against wall time: the
    same number of points, x in seconds from the first step (so not the step numbers)."""
    from playwright.sync_api import expect

    def mean_x():
        return page.evaluate("""() => document.getElementById("chart-reward").data
                                .find(t => t.name === "mean").x""")

    by_step = mean_x()
    page.check('#axis-switch input[value="wall"]')
    expect(page.locator("#chart-reward .xtitle")).to_have_text("wall time (s)")
    by_wall = mean_x()
    assert len(by_wall) == len(by_step) > 0 and by_wall[0] is not None, (by_step, by_wall)
    assert by_wall != by_step and by_wall == sorted(by_wall), (by_step, by_wall)
    page.check('#axis-switch input[value="step"]')
    expect(page.locator("#chart-reward .xtitle")).to_have_text("step")
    assert mean_x() == by_step


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_a_run_and_its_fork_compared_show_both_traces_in_every_chart(stack, browser):  # noqa: F811
    from playwright.sync_api import expect

    with browser_page(browser, "compare_failure.png") as page:
        log_in(page, stack)
        page.goto(stack + "/runs/new")
        page.fill("#id_config", COMPARE_TOML)
        page.click("form.run-form button[type=submit]")
        page.wait_for_url(re.compile(r"/runs/\d+$"))
        run_url = page.url
        run_id = run_url.rsplit("/", 1)[1]
        print(f"parent steps: {wait_for_steps(page, stack, run_id, 2, 120)}")
        stop_by_request(page, run_url, timeout_s=120)   # it checkpoints on the way out

        page.goto(run_url + "/fork")
        page.select_option("#id_async_policy", "one_step_off")
        page.click("form.fork-form button[type=submit]")
        expect(page.locator("#config-diff pre.diff")).to_contain_text('+type = "one_step_off"')
        page.click("form.fork-form button[name=launch]")
        page.wait_for_url(lambda url: re.search(r"/runs/\d+$", url) and url != run_url)
        fork_url = page.url
        fork_id = fork_url.rsplit("/", 1)[1]
        print(f"fork steps: {wait_for_steps(page, stack, fork_id, 2, 120)}")
        stop_by_request(page, fork_url, timeout_s=120)

        page.goto(fork_url)   # finished: its page no longer streams
        expect(page.locator("#run-progress")).to_contain_text("of 5000")
        run_page_wall_axis(page)
        page.click("a.compare-parent")
        page.wait_for_url(re.compile(rf"/runs/compare\?ids={run_id},{fork_id}$"))
        expect(page.locator("#compare-config")).to_contain_text("one_step_off")
        points = trace_points(page)
        print(f"compare, points per trace (parent, fork) by chart: {points}")
        assert all(len(traces) == 2 for traces in points.values()), points
        # Held-out eval too: with eval_every_steps = 0 it runs before and after each run.
        assert all(min(traces) > 0 for traces in points.values()), points

        page.check('#axis-switch input[value="wall"]')   # the same traces, by wall time
        expect(page.locator("#chart-compare-reward-mean .xtitle")).to_have_text(
            "wall time (s)")
        assert trace_points(page) == points
        expect(page.locator("#compare-summary")).to_contain_text("resync latency p50")
        ARTIFACTS.mkdir(exist_ok=True)
        shot = ARTIFACTS / "compare.png"
        page.screenshot(path=str(shot), full_page=True)
        print(f"compare screenshot: {shot}")
