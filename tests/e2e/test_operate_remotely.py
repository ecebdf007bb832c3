"""Operate from a terminal against the real stack (controlplane.stack --no-demo): the
`rlplane` CLI as a subprocess, the REST API over HTTP, a Prometheus scrape, the queue.

    settings page (session login) -> an API token, shown once
    rlplane login -> rlplane launch A (in process: one run slot, RLPLANE_MAX_LOCAL_RUNS=1)
    -> rlplane watch A --steps 3: step lines with reward, bubble, ...
    -> GET /metrics, parsed with prometheus-client: A's latest reward and bubble
    -> rlplane launch B: queued, "waits for 1 run slot; 0 of 1 free" on its page
    -> rlplane stop A -> A stopped, B starts -> rlplane stop B -> rlplane logs A
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


def api(base: str, token: str, path: str):
    request = urllib.request.Request(f"{base}/api/v1{path}",
                                     headers={"Authorization": f"Bearer {token}"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=30) as response:
        return json.loads(response.read())


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
    # An API token from the settings page, shown once.
    browser = Browser(stack)
    browser.post_form("/login", {"username": "operator", "password": PASSWORD})
    page = browser.post_form("/settings/tokens", {"name": "e2e cli"})
    token = html.unescape(re.search(r'<code id="token-value">([^<]+)</code>', page).group(1))
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
