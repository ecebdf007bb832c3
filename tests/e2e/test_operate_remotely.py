"""Operate from a terminal against the real stack (controlplane.stack --no-demo): the
`rlplane` CLI as a subprocess, the REST API over HTTP, a Prometheus scrape, the queue.

    settings page (session login) -> an API token, shown once
    rlplane login -> rlplane launch A (in process: one run slot, RLPLANE_MAX_LOCAL_RUNS=1)
    -> rlplane watch A --steps 3: step lines with reward, bubble, ...
    -> GET /metrics, parsed with prometheus-client: A's latest reward and bubble
    -> rlplane launch B: queued, "waits for 1 run slot; 0 of 1 free" on its page
    -> rlplane stop A -> A stopped, B starts -> rlplane stop B -> rlplane logs A

Live controls on a running run, over the REST API (the CLI's path):
    checkpoint now -> in the checkpoints list; set_lr -> learner/lr of the next step;
    pause -> the step count holds while the page says "paused"; resume -> it goes on
"""

from __future__ import annotations

import html
import http.cookiejar
import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ..stack_helpers import running_stack
from .test_browser import RUN_TOML

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "e2e-operator-password"
SCRAPE_TOKEN = "e2e-scrape-token"


@pytest.fixture(scope="module")
def stack():
    with running_stack("rlcli", RLPLANE_ADMIN_USER="operator",
                       RLPLANE_ADMIN_PASSWORD=PASSWORD, RLPLANE_MAX_LOCAL_RUNS="1",
                       RLPLANE_METRICS_TOKEN=SCRAPE_TOKEN) as (url, _):
        yield url


class Browser:
    """A logged-in session over plain HTTP (cookies + CSRF), as a browser would be."""

    def __init__(self, base: str):
        self.base = base
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                                  urllib.request.HTTPCookieProcessor(self.jar))

    def get(self, path: str) -> str:
        with self.opener.open(self.base + path, timeout=30) as response:
            return response.read().decode()

    def post_form(self, path: str, fields: dict) -> str:
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', self.get(path)).group(1)
        data = urllib.parse.urlencode({**fields, "csrfmiddlewaretoken": csrf}).encode()
        request = urllib.request.Request(self.base + path, data=data,
                                         headers={"Referer": self.base + path})
        with self.opener.open(request, timeout=30) as response:
            return response.read().decode()


def rlplane(config_dir: Path, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "RLPLANE_CONFIG_DIR": str(config_dir)}
    return subprocess.run([sys.executable, "-m", "rlplane", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout_s)


def api(base: str, token: str, path: str, body: dict | None = None):
    """GET (or POST ``body``) an /api/v1 path as the token's user; an error answer comes
    back as (status, JSON body) rather than raising."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{base}/api/v1{path}", data=data, headers={
        "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=30) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def operator_token(base: str) -> tuple[Browser, str]:
    """The operator logged in, and an API token from the settings page (shown once)."""
    browser = Browser(base)
    browser.post_form("/login", {"username": "operator", "password": PASSWORD})
    page = browser.post_form("/settings/tokens", {"name": "e2e"})
    return browser, html.unescape(
        re.search(r'<code id="token-value">([^<]+)</code>', page).group(1))


def wait_for(what: str, ready, deadline_s: float):
    deadline = time.monotonic() + deadline_s
    while True:
        value = ready()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within {deadline_s:.0f}s")
        time.sleep(0.5)


def scrape(base: str) -> dict:
    request = urllib.request.Request(base + "/metrics",
                                     headers={"Authorization": f"Bearer {SCRAPE_TOKEN}"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=30) as response:
        text = response.read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_launch_watch_scrape_queue_and_stop_from_the_cli(stack, tmp_path):
    browser, token = operator_token(stack)
    cfg = tmp_path / "cli"
    login = rlplane(cfg, "login", stack, "--token", token)
    assert login.returncode == 0, login.stderr

    # Launch A, watch it for a few steps.
    config = tmp_path / "run.toml"
    config.write_text(RUN_TOML)
    launched = rlplane(cfg, "launch", str(config), "--set", 'name="cli-a"', "-q")
    assert launched.returncode == 0, launched.stderr
    a = int(launched.stdout.strip())
    watched = rlplane(cfg, "watch", str(a), "--steps", "3", "--interval", "1", timeout_s=300)
    assert watched.returncode == 0, watched.stderr
    lines = [line for line in watched.stdout.splitlines() if "reward/mean=" in line]
    steps = [int(re.search(r" step=(\d+)", line).group(1)) for line in lines
             if " step=None" not in line]
    assert steps and steps[-1] >= 2 and steps == sorted(steps), watched.stdout
    assert re.search(r"reward/mean=-?[\d.]", lines[-1]) and "bubble=" in lines[-1]
    print(watched.stdout)

    # Prometheus: A's latest reward and bubble, as the API has them at that step.
    got = scrape(stack)
    step = next(int(s.value) for s in got["rlplane_run_step"] if s.labels["run"] == str(a))
    scraped = {s.labels["name"]: s.value for s in got["rlplane_run_metric"]
               if s.labels["run"] == str(a)}
    series = api(stack, token, f"/runs/{a}/metrics?name=reward/mean&name=bubble"
                               f"&start={step}&end={step}")["series"]
    assert scraped["reward/mean"] == pytest.approx(series["reward/mean"]["values"][0])
    assert scraped["bubble"] == pytest.approx(series["bubble"]["values"][0])

    # B waits for A's run slot, saying so on its page.
    second = rlplane(cfg, "launch", str(config), "--set", 'name="cli-b"', "-q")
    assert second.returncode == 0, second.stderr
    b = int(second.stdout.strip())
    assert api(stack, token, f"/runs/{b}")["status"] == "queued"
    run_page = browser.get(f"/runs/{b}")
    assert 'id="queue-reason"' in run_page
    assert "waits for 1 run slot; 0 of 1 free" in html.unescape(run_page)
    assert any(s.value == 1 for s in scrape(stack)["rlplane_queue_length"])

    # Stop A: once it is stopped, B starts.
    stopped = rlplane(cfg, "stop", str(a))
    assert stopped.returncode == 0 and "stopping" in stopped.stdout, stopped.stderr
    wait_for("A stopped", lambda: api(stack, token, f"/runs/{a}")["status"] == "stopped", 120)
    wait_for("B started", lambda: api(stack, token, f"/runs/{b}")["status"] == "running", 180)
    assert rlplane(cfg, "stop", str(b)).returncode == 0
    wait_for("B stopped", lambda: api(stack, token, f"/runs/{b}")["status"] == "stopped", 120)

    logs = rlplane(cfg, "logs", str(a))
    assert logs.returncode == 0 and "[status] stopped" in logs.stdout, logs.stdout
    again = rlplane(cfg, "stop", str(a))
    assert again.returncode == 6 and "final" in again.stderr


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_live_controls_checkpoint_pause_resume_and_lr_on_a_running_run(stack):
    browser, token = operator_token(stack)
    run = api(stack, token, "/runs", {"toml": RUN_TOML.replace('"e2e-browser"', '"live"')})
    rid = run["id"]

    def step() -> int:
        """The last training step the control plane has (eval-only steps do not count)."""
        latest = api(stack, token, f"/runs/{rid}")["latest"].get("time/step_s")
        return -1 if latest is None else latest["step"]

    def applied(body: dict) -> dict:
        control = api(stack, token, f"/runs/{rid}/controls", body)
        assert control["applied_step"] is None  # asked; the driver applies it later
        return wait_for(f"{body} applied", lambda: next((
            c for c in api(stack, token, f"/runs/{rid}/controls") if c["id"] == control["id"]
            and c["applied_step"] is not None), None), 120)

    wait_for("a first step", lambda: step() >= 0, 240)

    status, error = api(stack, token, f"/runs/{rid}/controls", {"kind": "set_lr", "value": 0})
    assert status == 400 and error["errors"][0]["field"] == "value", error

    # Checkpoint now: listed at the step it was written.
    checkpoint = applied({"kind": "checkpoint"})
    steps = [c["step"] for c in api(stack, token, f"/runs/{rid}/checkpoints")]
    assert checkpoint["applied_step"] in steps, (checkpoint, steps)

    # A new learning rate: the next step's learner/lr, measured by the learner.
    lr = applied({"kind": "set_lr", "value": 2e-5})
    at = lr["applied_step"]
    wait_for("the step after the lr change", lambda: step() >= at, 120)
    series = api(stack, token, f"/runs/{rid}/metrics?name=learner/lr&start={at - 1}"
                               f"&end={at}")["series"]["learner/lr"]
    assert dict(zip(series["steps"], series["values"], strict=True)) == {
        at - 1: pytest.approx(1e-4), at: pytest.approx(2e-5)}

    # Pause: the loop finishes its step and holds; the page says so.
    pause = applied({"kind": "pause"})
    held = pause["applied_step"]
    assert api(stack, token, f"/runs/{rid}")["paused"] is True
    assert 'class="badge badge-paused">paused</span>' in browser.get(f"/runs/{rid}")
    assert step() == held - 1
    time.sleep(6)  # three of the driver's polls: a run that did not hold would step here
    assert step() == held - 1

    # Resume: it goes on; each control is a line of the run's log naming who asked.
    applied({"kind": "resume"})
    wait_for("a step after resume", lambda: step() >= held, 120)
    assert api(stack, token, f"/runs/{rid}")["paused"] is False
    log = api(stack, token, f"/runs/{rid}/events?type=control.applied")["events"]
    assert [e["kind"] for e in log] == ["checkpoint", "set_lr", "pause", "resume"]
    assert all(e["message"].endswith("(by operator)") for e in log), log
    page = html.unescape(browser.get(f"/runs/{rid}"))
    assert f'"step": {at}, "label": "lr 2e-05"' in page  # the charts' mark
    print(f"live controls on run {rid}: checkpoint at step {checkpoint['applied_step']}; "
          f"learner/lr {series['values']} at steps {series['steps']}; paused before step "
          f"{held}, {step()} reached after resume")

    api(stack, token, f"/runs/{rid}/stop", {})
    wait_for("stopped", lambda: api(stack, token, f"/runs/{rid}")["status"] == "stopped", 120)
