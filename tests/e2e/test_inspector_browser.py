"""End to end in a real browser: the rollout inspector of a live run follows its steps.

    log in -> new run -> its run page -> "Samples" -> the inspector: groups of rollouts
    with coloured tokens -> the step slider advances over the websocket (same page, no
    reload) -> screenshot: tests/e2e/artifacts/inspector_live.png -> back, Stop
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
    log_in_and_launch,
    stack,
    stop_from_page,
)

INSPECTED_TOML = RUN_TOML.replace('name = "e2e-browser"', 'name = "e2e-inspector"')


def shown_step(page) -> int | None:
    text = page.locator("#step-label").text_content()
    return int(text) if text and text.isdigit() else None


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_the_inspector_of_a_live_run_advances_its_step_slider(stack, browser):  # noqa: F811
    from playwright.sync_api import expect

    with browser_page(browser, "inspector_failure.png") as page:
        log_in_and_launch(page, stack, INSPECTED_TOML)
        run_url = page.url
        page.click("a.samples-link")
        page.wait_for_url(re.compile(r"/runs/\d+/samples$"))
        page.evaluate("window.__sameDocument = true")   # gone if the page reloads

        expect(page.locator(".sample-group").first).to_be_visible(timeout=90_000)
        first = shown_step(page)
        deadline = time.monotonic() + 90
        while (shown_step(page) or -1) <= (first if first is not None else -1):
            assert time.monotonic() < deadline, f"the slider stayed at step {first}"
            page.wait_for_timeout(250)
        assert page.evaluate("window.__sameDocument === true"), "the page was reloaded"
        later = shown_step(page)
        expect(page.locator("#inspector-summary")).to_contain_text(f"Step {later}:")
        assert page.locator("#step-slider").input_value() == page.evaluate(
            "document.getElementById('step-slider').max"), "the slider is not at the latest"
        # group_size = 2 rollouts per group, each with its tokens coloured by logprob gap
        group = page.locator(".sample-group").first
        assert group.locator(".sample").count() == 2
        assert group.locator(".tokens .tok").count() >= 2
        ARTIFACTS.mkdir(exist_ok=True)
        shot = ARTIFACTS / "inspector_live.png"
        page.screenshot(path=str(shot), full_page=True)
        print(f"inspector screenshot (steps {first} -> {later}): {shot}")

        page.set_default_timeout(120_000)      # the stop's reload, on a busy host
        page.goto(run_url)
        stop_from_page(page, timeout_s=120)
