"""In a real browser, without a stack: the inspector's trajectory view of a multi-turn
rollout (issue 32), on the page and JSON the app serves for a samples event ingested as the
engine sends it. The page is rendered by the Django test client, so this costs a browser, not a run;
its own module, because Playwright's sync API runs an event loop in the thread, and the
database fixtures must be set up before one starts (tests/e2e/test_browser.py's browser is
module-scoped: it would start first).
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect, sync_playwright

from engine.api import RolloutSample, SamplesEvent
from jobs.ingest.store import do_ingest_events
from jobs.models import Run, RunStatus

from .test_browser import ARTIFACTS, CHROMIUM_ARGS, browser_page, chromium

TURNS = [{"role": "model", "start": 0, "end": 2, "version": 3, "reward": 0.0},
         {"role": "env", "start": 2, "end": 4, "version": None, "reward": None},
         {"role": "model", "start": 4, "end": 6, "version": 4, "reward": 1.0}]


def serve(page, origin: str, pages: dict[str, bytes]) -> None:
    """The browser's requests to ``origin``: ``pages`` by path (rendered by the app
    beforehand), static files as Django's finders find them."""
    from django.contrib.staticfiles import finders

    def answer(route):
        path = route.request.url.removeprefix(origin)
        if path in pages:
            return route.fulfill(body=pages[path], content_type="text/html; charset=utf-8")
        found = finders.find(path.removeprefix("/static/")) if path.startswith(
            "/static/") else None
        if found is None:
            return route.fulfill(status=404)
        kind = {".css": "text/css", ".svg": "image/svg+xml"}.get(
            found[found.rfind("."):], "application/javascript")
        return route.fulfill(body=open(found, "rb").read(), content_type=kind)

    page.route(origin + "/**", answer)


@pytest.mark.e2e
@pytest.mark.django_db
def test_a_trajectory_is_drawn_turn_by_turn_observations_unshaded(client, django_user_model):
    run = Run.objects.create(name="trajectory", config={"name": "t", "steps": 3})
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)  # no live socket
    traj = RolloutSample(
        group=0, prompt="7*8", completion="7*8=56:56", reward=1.0, version=3, last_version=4,
        length=6, tokens=["7*8", "=", "56", ":", "56", "<eos>"],
        behaviour_logprobs=[-0.5, -0.5, None, None, -0.5, -0.5],
        learner_logprobs=[-0.5, -1.5, None, None, -0.5, -0.5], turns=TURNS)
    do_ingest_events(run, [SamplesEvent(seq=1, ts=1000.0, step=2, samples=[traj])])
    client.force_login(django_user_model.objects.create_user("viewer"))
    path = f"/runs/{run.pk}/samples"
    # Rendered before Playwright starts: its sync API runs an event loop in this thread,
    # and its route handlers run where the test's database transaction is not.
    response = client.get(path)
    assert response.status_code == 200

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium()), args=CHROMIUM_ARGS)
        try:
            look_at_the_trajectory(browser, path, response.content)
        finally:
            browser.close()


def look_at_the_trajectory(browser, path: str, html: bytes) -> None:
    with browser_page(browser, "inspector_trajectory_failure.png") as page:
        serve(page, "http://rlplane.test", {path: html})
        page.goto("http://rlplane.test" + path)

        turns = page.locator(".sample .trajectory .turn")
        expect(turns).to_have_count(3)
        assert [turns.nth(i).get_attribute("data-role") for i in range(3)] == [
            "model", "env", "model"]
        expect(turns.nth(0).locator(".turn-head")).to_have_text(
            "turn 1 · version 3 · reward 0.000")
        expect(turns.nth(2).locator(".turn-head")).to_have_text(
            "turn 2 · version 4 · reward 1.000")
        expect(turns.nth(1).locator(".turn-head")).to_have_text("observation")
        # the model's tokens are shaded by their gap (1.0 on "="), the observation's not
        assert turns.nth(0).locator(".tok").nth(1).get_attribute("data-gap") == "1"
        observed = turns.nth(1).locator(".tok")
        assert observed.all_text_contents() == ["56", ":"]
        assert all(observed.nth(i).get_attribute("data-gap") is None for i in range(2))
        assert "tok-obs" in observed.nth(0).get_attribute("class")
        expect(page.locator(".sample-facts")).to_contain_text("3→4")
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "inspector_trajectory.png"), full_page=True)
