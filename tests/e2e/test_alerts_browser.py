"""End to end in a real browser: a run launched with skip_weight_sync gets its
WeightSyncDesync alert on the run page without a reload, and the operator acknowledges it.

    log in -> new run (faults.skip_weight_sync from step 2) -> run page: the alert appears
    over the websocket (same page, no navigation) -> Acknowledge -> "acknowledged"
    (screenshot: tests/e2e/artifacts/alert_acknowledged.png) -> Stop
"""

from __future__ import annotations

import pytest

from .test_browser import (  # noqa: F401 (fixtures)
    ARTIFACTS,
    RUN_TOML,
    browser,
    log_in_and_launch,
    stack,
    stop_from_page,
)

FAULTY_TOML = RUN_TOML.replace('name = "e2e-browser"', 'name = "e2e-alerts"') + """
[faults.skip_weight_sync]
from_step = 2
"""


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_desync_alert_appears_live_and_is_acknowledged(stack, browser):  # noqa: F811
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1400, "height": 1200})
    page.set_default_timeout(30_000)
    try:
        log_in_and_launch(page, stack, FAULTY_TOML)
        page.evaluate("window.__sameDocument = true")   # gone if the page reloads

        alert = page.locator('#run-alerts [data-kind="WeightSyncDesync"]')
        expect(alert).to_be_visible(timeout=90_000)
        expect(page.locator('#run-health [data-family="systems"]')).to_have_attribute(
            "data-colour", "red")                     # the health strip follows, live
        assert page.evaluate("window.__sameDocument === true"), "the page was reloaded"
        expect(alert.locator(".alert-cause")).to_contain_text(
            "the generator is not receiving new weights")
        assert alert.locator(".sparkline polyline").count() == 1

        alert.locator("button.alert-ack").click()
        expect(alert).to_have_attribute("data-state", "acknowledged")
        ARTIFACTS.mkdir(exist_ok=True)
        shot = ARTIFACTS / "alert_acknowledged.png"
        page.screenshot(path=str(shot), full_page=True)
        print(f"alert screenshot: {shot}")
        stop_from_page(page)
    except BaseException:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "alert_failure.png"), full_page=True)
        raise
    finally:
        page.close()
