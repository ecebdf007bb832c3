"""End to end in a real browser: Playwright drives Debian's chromium against the stack the
main command starts (controlplane.stack --no-demo, free port, temp state dir), one stack
for this module and the other browser modules (test_alerts_browser,
test_inspector_browser, test_external_trl_browser).

    log in -> new run form -> run page: the reward chart grows without a reload
    -> Stop -> badge "stopped", a checkpoint listed (screenshot) -> Fork from it with a
    changed config -> review the diff -> Launch fork -> the fork's badge reaches "running"
    -> the runs list shows the fork's steps live -> Stop it too -> the finished fork's
    page against wall time -> Compare with parent: both runs' traces in every chart, by
    step and by wall time (screenshot: artifacts/compare.png; once a test of its own that
    launched, stopped and forked a run of its own, 31 s of CI)

No browser is ever downloaded: chromium comes from Debian (scripts/setup installs it as
root). Without it this test fails, saying how to install it; it is never skipped.
"""

from __future__ import annotations

import re
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from ..shared import OPERATOR_PASSWORD as PASSWORD

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"

# Starts in seconds (no warm start, a tiny model, a few prompts per step) and would run
# for many minutes: the test stops it.
RUN_TOML = """\
name = "e2e-browser"
steps = 5000

[model]
size = "tiny"

[task]
type = "arithmetic"
ops = ["+"]
min_digits = 1
max_digits = 1
eval_size = 8

[warm_start]
steps = 0

[algorithm]
group_size = 2
minibatches = 1

[rollout]
temperature = 1.0
max_new_tokens = 4
prompts_per_step = 4
"""


def chromium() -> Path:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: the browser tests drive Debian's chromium. "
                    "Install it with `sudo apt-get install -y chromium` (scripts/setup does "
                    "this when run as root); never a Playwright browser download.")
    return CHROMIUM




@pytest.fixture
def stack(shared_stack):
    """The real stack, shared by the browser modules (tests/shared.py): started by the
    first of their tests, stopped after the last, leaving nothing. Each test launches
    runs of its own and stops them."""
    return shared_stack


@pytest.fixture(scope="module")
def browser():     # set up before the stack: without chromium, no stack is started
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(chromium()), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def reward_points(page) -> int:
    """Points in the reward chart's mean trace, as Plotly holds them (no reload)."""
    return page.evaluate("""() => {
        const div = document.getElementById("chart-reward");
        const mean = (div && div.data || []).find(t => t.name === "mean");
        return mean ? mean.x.length : -1;
    }""")


def wait_for_growth(page, times: int, deadline_s: float) -> list[int]:
    seen = [reward_points(page)]
    deadline = time.monotonic() + deadline_s
    while len(seen) <= times:
        assert time.monotonic() < deadline, f"the reward chart grew only {seen} in {deadline_s}s"
        page.wait_for_timeout(250)
        n = reward_points(page)
        if n > seen[-1]:
            seen.append(n)
    return seen


def expect_status(page, status: str, timeout_s: float) -> None:
    from playwright.sync_api import expect

    expect(page.locator("#run-status")).to_have_text(status, timeout=timeout_s * 1000)


def stop_from_page(page, timeout_s: float = 60) -> None:
    from playwright.sync_api import expect

    page.locator("form button.stop").click()
    page.wait_for_load_state()
    expect_status(page, "stopped", timeout_s)
    # Reached live (the page shows "stopping" after the click): a final status, as the
    # server lists them, takes the Stop button away without a reload.
    expect(page.locator("#stop-form")).to_have_count(0)


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_launch_watch_stop_and_fork_a_run_in_the_browser(stack, browser):
    with browser_page(browser, "failure.png") as page:
        operate(page, stack)


@contextmanager
def browser_page(browser, failure_shot: str):
    """A page that leaves a full-page screenshot in artifacts/ when the test fails."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(30_000)
    try:
        yield page
    except BaseException:
        ARTIFACTS.mkdir(exist_ok=True)
        shot = ARTIFACTS / failure_shot
        try:       # a busy browser may not answer; the test's own error must still show
            page.screenshot(path=str(shot), full_page=True, timeout=10_000)
            print(f"the page when the test failed ({page.url}): {shot}")
        except Exception as exc:
            print(f"no screenshot of the failed page ({page.url}): {exc}")
        raise
    finally:
        page.close()


def log_in(page, stack: str) -> None:
    page.goto(stack + "/")
    page.fill("#id_username", "operator")
    page.fill("#id_password", PASSWORD)
    page.click("form.login button[type=submit]")
    page.wait_for_url(stack + "/")


def log_in_and_launch(page, stack: str, run_toml: str) -> None:
    """Log in as the operator, launch ``run_toml`` from the new-run form, and wait on its
    page until it is running."""
    log_in(page, stack)
    page.goto(stack + "/runs/new")
    page.fill("#id_config", run_toml)
    page.click("form.run-form button[type=submit]")
    page.wait_for_url(re.compile(r"/runs/\d+$"))
    expect_status(page, "running", 90)


# A run that ends on its own while its page is open.
SHORT_STEPS = 30   # the "step 29 of 30"
SHORT_TOML = RUN_TOML.replace('name = "e2e-browser"', 'name = "e2e-short"').replace(
    "steps = 5000", f"steps = {SHORT_STEPS}")

# Every text the header's elapsed and ETA show, and a mark that a reload would wipe.
WATCH_HEADER = """() => {
    window.__notReloaded = true;
    window.__seen = {elapsed: [], eta: []};
    for (const [id, key] of [["progress-elapsed", "elapsed"], ["progress-eta", "eta"]]) {
        const el = document.getElementById(id);
        const note = () => { if (!window.__seen[key].includes(el.textContent))
                                 window.__seen[key].push(el.textContent); };
        note();
        new MutationObserver(note).observe(el, {childList: true, characterData: true,
                                                subtree: true});
    }
}"""


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_run_page_left_open_follows_the_run_to_its_end(stack, browser):
    from playwright.sync_api import expect

    with browser_page(browser, "short_failure.png") as page:
        log_in(page, stack)
        page.goto(stack + "/runs/new")
        page.fill("#id_config", SHORT_TOML)
        page.click("form.run-form button[type=submit]")
        page.wait_for_url(re.compile(r"/runs/\d+$"))
        page.evaluate(WATCH_HEADER)
        expect(page.locator("#archive-form")).to_be_hidden()

        expect_status(page, "succeeded", 240)
        header = page.locator("#run-progress")
        expect(header.locator("#progress-step")).to_have_text(str(SHORT_STEPS))
        expect(header).to_contain_text(f"{SHORT_STEPS} of {SHORT_STEPS}")
        expect(page.locator("#run-status-reason")).to_have_text(
            f"trained all {SHORT_STEPS} steps")
        expect(page.locator("#archive-form")).to_be_visible()
        expect(page.locator("#delete-form")).to_be_visible()
        expect(page.locator("#progress-eta-item")).to_be_hidden()
        expect(page.locator("#live-controls")).to_have_count(0)
        seen = page.evaluate("() => window.__notReloaded && window.__seen")
        print(f"the header while it ran: {seen}")
        assert seen, "the page reloaded"
        assert len(seen["elapsed"]) >= 2, seen
        assert len([eta for eta in seen["eta"] if eta != "–"]) >= 2, seen


# The shipped GSM8K-format sample with the math verifier, on the in-process placement.
DATASET_TOML = f"""\
name = "e2e-dataset"
steps = 5000

[model]
size = "tiny"

[task]
type = "dataset"
path = "{REPO / 'data' / 'gsm8k_sample' / 'train.jsonl'}"
eval_path = "{REPO / 'data' / 'gsm8k_sample' / 'test.jsonl'}"
prompt_key = "question"
answer_key = "answer"
max_prompt_tokens = 64
eval_size = 8

[reward]
type = "math"

[warm_start]
steps = 0

[algorithm]
group_size = 2
minibatches = 1

[rollout]
max_new_tokens = 6
prompts_per_step = 4
"""


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_dataset_run_with_the_math_verifier_launches_from_the_form(stack, browser):
    with browser_page(browser, "dataset_failure.png") as page:
        log_in_and_launch(page, stack, DATASET_TOML)
        facts = page.locator("#run-facts").inner_text()
        assert "dataset" in facts and "train.jsonl" in facts and "math" in facts
        growth = wait_for_growth(page, times=2, deadline_s=90)
        print(f"dataset run, reward chart points, live: {growth}")
        stop_from_page(page)


# Written in a file, pasted whole: the placement and the policy are the TOML's own.
PASTED_TOML = RUN_TOML.replace('name = "e2e-browser"', 'name = "e2e-pasted"') + """
[placement]
type = "disaggregated"
rollout_workers = 1
learner_devices = 1

[async_policy]
type = "fully_async"
max_staleness = 2

[weight_sync]
type = "shm"
"""


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(720)
def test_a_pasted_config_launches_with_its_own_placement_and_policy(stack, browser):
    from playwright.sync_api import expect

    with browser_page(browser, "pasted_failure.png") as page:
        log_in(page, stack)
        page.goto(stack + "/runs/new")
        expect(page.locator("#id_placement")).to_have_value("colocated")

        # A bad value: Validate names it at its TOML line, and the line can be selected.
        bad = PASTED_TOML.replace("max_staleness = 2", "max_staleness = 99")
        line = bad.splitlines().index("max_staleness = 99") + 1
        page.fill("#id_config", bad)
        page.click("button.validate-button")
        error = page.locator('#validation li[data-path="async_policy.max_staleness"]')
        expect(error).to_have_attribute("data-line", str(line))
        expect(error.locator("a.toml-line")).to_have_text(f"line {line}")
        expect(error.locator("pre.toml-source")).to_have_text(f"{line} | max_staleness = 99")
        error.locator("a.toml-line").click()
        selected = page.evaluate("""() => { const t = document.getElementById("id_config");
                                     return t.value.slice(t.selectionStart, t.selectionEnd); }""")
        assert selected == "max_staleness = 99"

        # The good config, pasted: the selects show its choices without being touched.
        page.fill("#id_config", PASTED_TOML)
        expect(page.locator("#id_placement")).to_have_value("disaggregated")
        expect(page.locator("#id_async_policy")).to_have_value("fully_async")
        preview = page.locator("#placement-preview")
        deadline = time.monotonic() + 240   # the queue, too, waits for Ray to answer
        while True:        # a fresh Ray head reports its resources after its first seconds
            page.click("button.validate-button")
            expect(preview).to_contain_text("2 bundles (1 + 1 GPUs, PACK): 2 devices")
            if preview.get_attribute("data-fits") != "unknown":
                break
            assert time.monotonic() < deadline, preview.inner_text()
            page.wait_for_timeout(1000)
        expect(preview).to_have_attribute("data-fits", "yes")
        print(f"placement preview: {preview.inner_text()}")

        page.click("form.run-form button[type=submit]")
        page.wait_for_url(re.compile(r"/runs/\d+$"))
        facts = page.locator("#run-facts").inner_text()
        assert "disaggregated (1 rollout x 1, learner 1)" in facts and "fully_async" in facts
        expect_status(page, "running", 120)
        growth = wait_for_growth(page, times=2, deadline_s=120)
        print(f"pasted disaggregated fully-async run, reward chart points: {growth}")
        stop_by_request(page, page.url, timeout_s=180)


def stop_by_request(page, run_url: str, timeout_s: float) -> None:
    """The Stop form's POST, sent from the page's session without its renderer: a Ray run
    streaming every step keeps a starved browser's renderer too busy to click (the Stop
    button itself is driven in test_launch_watch_stop_and_fork_a_run_in_the_browser).
    Waits for the run to reach "stopped" (a Ray run tears down its actors first)."""
    page.goto("about:blank")
    csrf = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    response = page.request.post(run_url + "/stop", max_redirects=0,
                                 headers={"X-CSRFToken": csrf, "Referer": run_url})
    assert response.status == 302, response.status
    deadline = time.monotonic() + timeout_s
    while 'class="badge badge-stopped"' not in page.request.get(run_url).text():
        assert time.monotonic() < deadline, f"{run_url} not stopped in {timeout_s} s"
        time.sleep(1)


def operate(page, stack: str) -> None:

    # 1-2. Log in (every page requires it) and launch a run from the new-run form.
    log_in_and_launch(page, stack, RUN_TOML)
    run_url = page.url

    # 3. The reward chart gains points from the websocket, without a reload.
    growth = wait_for_growth(page, times=2, deadline_s=60)
    assert page.url == run_url
    print(f"reward chart points, live: {growth}")

    # 4-5. Stop it from the page: the badge becomes "stopped", a checkpoint is listed.
    stop_from_page(page)
    rows = page.locator("#run-checkpoints tr")
    rows.first.wait_for()
    assert rows.count() >= 1
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "run_page.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"run page screenshot: {shot}")

    # 6. Fork it from that checkpoint with another async policy (the in-process placement
    # runs every policy, so the fork needs no Ray placement group).
    page.click("a.button:has-text('Fork')")
    page.wait_for_url(re.compile(r"/runs/\d+/fork"))
    assert page.locator("#id_checkpoint option").count() >= 1
    page.select_option("#id_async_policy", "one_step_off")
    page.click("form.fork-form button[type=submit]")
    diff = page.locator("#config-diff pre.diff")
    assert '+type = "one_step_off"' in diff.inner_text()
    page.click("form.fork-form button[name=launch]")
    page.wait_for_url(lambda url: re.search(r"/runs/\d+$", url) and url != run_url)
    assert page.locator(".fork-of").inner_text().startswith("fork of")
    expect_status(page, "running", 90)

    # 7. The runs list follows the fork from its websocket: the step cell it was drawn
    # with changes in place (an htmx reload of the table would replace the cell).
    fork_url = page.url
    page.goto(stack + "/")
    page.evaluate("""(id) => {
        window.__stepCell = document.querySelector("#run-" + id + " td.step");
        window.__firstStep = window.__stepCell.textContent;
    }""", fork_url.rsplit("/", 1)[1])
    page.wait_for_function("""() => window.__stepCell.isConnected
                              && window.__stepCell.textContent !== window.__firstStep""",
                           timeout=60_000)
    page.goto(fork_url)
    stop_from_page(page)

    # 8. The finished fork's page draws against wall time too; compared with its parent,
    # both runs' traces are in every chart, by step and by wall time.
    compare_with_parent(page, run_url.rsplit("/", 1)[1], fork_url.rsplit("/", 1)[1])


def compare_with_parent(page, run_id: str, fork_id: str) -> None:
    from playwright.sync_api import expect

    page.reload()        # finished: its page no longer streams
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
    expect(page.locator("#chart-compare-reward-mean .xtitle")).to_have_text("wall time (s)")
    assert trace_points(page) == points
    expect(page.locator("#compare-summary")).to_contain_text("resync latency p50")
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "compare.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"compare screenshot: {shot}")


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

