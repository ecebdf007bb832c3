"""End to end: a real TRL GRPOTrainer run, launched from the browser as an external
command run through the real stack (queue -> Celery -> Ray Job), reported by the TRL
callback through rlplane.track (issue 29's first must-show).

    log in -> New external run (TRL, entrypoint examples/trl_grpo.py --constant-reward)
    -> the run page: TRL's reward, length, KL and step time charted live under rlplane's
    names, the completions in the inspector -> a constant reward: StuckReward names the
    flat signal -> Stop: the callback ends training, the Ray job exits, the run is stopped
"""

from __future__ import annotations

import re
import sys

import pytest

from .test_browser import (  # noqa: F401 (fixtures)
    ARTIFACTS,
    REPO,
    browser,
    browser_page,
    expect_status,
    log_in,
    reward_points,
    stack,
    stop_from_page,
)

EXAMPLE_PROMPTS = ["12+34=", "7*8=", "99-100=", "3+4=", "Add 5 and 6:", "Twice 21 is",
                   "The answer is", "def f(x): return"]     # examples/trl_grpo.py's

# StuckReward fits its slope over stuck_window (20) steps; 400 is room to stop it.
ENTRYPOINT = f"{sys.executable} {REPO / 'examples' / 'trl_grpo.py'} --steps 400 --constant-reward"


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_trl_run_launched_as_a_command_is_watched_alerted_and_stopped(stack, browser):  # noqa: F811
    from playwright.sync_api import expect

    with browser_page(browser, "trl_failure.png") as page:
        log_in(page, stack)
        page.goto(stack + "/runs/new/external")
        page.fill("#id_name", "e2e-trl")
        page.select_option("#id_framework", "trl")
        page.fill("#id_params", "max_steps = 400\nbeta = 0.04\n")
        page.fill("#id_entrypoint", ENTRYPOINT)
        page.fill("#id_cpus", "1")
        page.click("#external-run-form button[type=submit]")
        page.wait_for_url(re.compile(r"/runs/\d+$"))
        run_url = page.url
        expect_status(page, "running", 120)

        # TRL's own names, charted as rlplane's: reward -> reward/mean, and so on
        page.wait_for_function("() => document.getElementById('chart-reward')?.data?.[0]"
                               "?.x?.length >= 3", timeout=120_000)
        assert reward_points(page) >= 3
        alert = page.locator('#run-alerts [data-kind="StuckReward"]')
        expect(alert).to_be_visible(timeout=150_000)
        expect(alert.locator(".alert-cause")).to_contain_text("learning signal is flat")
        header = page.locator("#run-progress").inner_text()
        assert "of 400" in header, header     # the step total from the run's max_steps

        stop_from_page(page, timeout_s=90)    # the callback stops TRL; the job exits
        logs = page.locator("#run-logs").inner_text()
        assert "stopped" in page.locator("#run-status").inner_text()

        page.goto(run_url + "/samples")
        inspector = page.locator("main").inner_text()
        # the latest step's groups draw any of the example's prompts (at step 66 in one CI
        # run: "The answer is" and another), not always the two arithmetic ones
        assert any(p in inspector for p in EXAMPLE_PROMPTS), inspector[:500]
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "trl_samples.png"), full_page=True)
        print(f"log panel at stop:\n{logs[-800:]}")
