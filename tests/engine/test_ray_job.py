"""``python -m engine.ray_job``: the Ray job's entry point, against a stand-in control plane
(a stdlib HTTP server that stores posted events and answers the control poll)."""

import json
import os
import shutil
import subprocess
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from engine.controls import PauseControl, SetLrControl
from engine.ray_job import ControlPoller, main
from engine.run_dir import check_run_dir, mark_run_dir

from .conftest import small_run

TOKEN = "run-token"
ROOT = Path(__file__).resolve().parents[2]


class ControlPlane:
    """Stores the events of POST /events, answers GET /controls?after=N with {"stop":
    stop_after_step reached, "controls": those of ``controls`` after N}; both require the
    run's token."""

    def __init__(self, stop_after_step: int | None = None):
        self.events: list[dict] = []
        self.stop_polls = 0
        self.stop_after_step = stop_after_step
        self.controls: list[dict] = []
        self.afters: list[str] = []    # the ``after`` of each poll
        plane = self

        class Handler(BaseHTTPRequestHandler):
            def _authorized(self) -> bool:
                if self.headers.get("Authorization") == f"Bearer {TOKEN}":
                    return True
                self._answer(403, {"error": "bad token"})
                return False

            def _answer(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self._authorized():
                    plane.events.extend(json.loads(body)["events"])
                    self._answer(200, {"stored": 0})

            def do_GET(self):
                if self._authorized():
                    plane.stop_polls += 1
                    query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
                    after = query.get("after", ["0"])[0]
                    plane.afters.append(after)
                    self._answer(200, {"stop": plane.should_stop(), "controls": [
                        c for c in plane.controls if c["id"] > int(after)]})

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def should_stop(self) -> bool:
        return self.stop_after_step is not None and any(
            e["type"] == "metrics.append" and e["step"] >= self.stop_after_step
            and "reward/mean" in e["values"] for e in self.events)

    def of_type(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["type"] == kind]

    def statuses(self) -> list[str]:
        return [e["status"] for e in self.of_type("run.status")]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def plane():
    planes: list[ControlPlane] = []

    def make(**kwargs) -> ControlPlane:
        planes.append(ControlPlane(**kwargs))
        return planes[-1]

    yield make
    for p in planes:
        p.close()


def driver_args(plane: ControlPlane, run_dir, cfg, *extra: str) -> list[str]:
    return ["--config-json", json.dumps(cfg.model_dump(mode="json")), "--run-dir", str(run_dir),
            "--ingest-url", f"{plane.url}/events", "--controls-url", f"{plane.url}/controls",
            "--poll-s", "0.1", "--token-env", "TEST_INGEST_TOKEN", *extra]


@pytest.fixture
def token_env(monkeypatch):
    monkeypatch.setenv("TEST_INGEST_TOKEN", TOKEN)


@pytest.mark.slow
def test_a_stop_request_checkpoints_and_a_fork_resumes_from_that_checkpoint(
        tmp_path, plane, token_env, model_cache):
    parent_plane = plane(stop_after_step=0)
    parent_dir = tmp_path / "parent"
    assert main(driver_args(parent_plane, parent_dir, small_run(steps=50))) == 0

    assert parent_plane.statuses()[-1] == "stopped"
    steps = [e["step"] for e in parent_plane.of_type("metrics.append")
             if "reward/mean" in e["values"]]
    assert 1 <= len(steps) < 50                    # stopped after the step in progress
    seqs = [e["seq"] for e in parent_plane.events]
    assert seqs == list(range(1, len(seqs) + 1))   # every event delivered, in order
    checkpoint = parent_plane.of_type("checkpoint.saved")[-1]
    assert checkpoint["step"] == len(steps)

    fork_plane = plane()
    fork_dir = tmp_path / "fork"
    cfg = small_run(steps=checkpoint["step"] + 1, rollout={"temperature": 0.7})
    assert main(driver_args(fork_plane, fork_dir, cfg,
                            "--from-checkpoint", checkpoint["path"])) == 0

    assert fork_plane.statuses()[-1] == "succeeded"
    fork_steps = [e["step"] for e in fork_plane.of_type("metrics.append")
                  if "reward/mean" in e["values"]]
    assert fork_steps == [checkpoint["step"]]      # continues where the parent stopped
    assert fork_plane.events[0]["seq"] == 1        # a new run: its own event sequence
    assert (fork_dir / "checkpoints" / f"step_{checkpoint['step']:06d}").is_dir()
    assert not (fork_dir / "ingest-spool.jsonl").exists()

    # The fork's driver restarted (run.max_restarts) with the same argv after the parent
    # was deleted: it resumes from its own checkpoint instead of failing on the parent's.
    shutil.rmtree(parent_dir)
    assert main(driver_args(fork_plane, fork_dir, cfg,
                            "--from-checkpoint", checkpoint["path"])) == 0
    assert fork_plane.statuses()[-1] == "succeeded"


def test_the_control_poller_treats_an_unreachable_control_plane_as_no(plane):
    cp = plane()
    cp.close()
    poller = ControlPoller(f"{cp.url}/stop", TOKEN, timeout_s=1.0)
    assert poller.poll_once() is False and poller() is False


def test_the_control_poller_sends_the_run_token_and_remembers_a_yes(plane):
    cp = plane(stop_after_step=0)
    poller = ControlPoller(f"{cp.url}/stop", TOKEN)
    assert poller.poll_once() is False
    cp.events.append({"type": "metrics.append", "step": 0, "values": {"reward/mean": 0.0}})
    assert poller.poll_once() is True
    cp.events.clear()
    assert poller() is True and cp.stop_polls == 2


def test_the_control_poller_asks_after_the_last_control_and_skips_a_bad_one(plane):
    cp = plane()
    cp.controls = [{"id": 3, "kind": "set_lr", "value": 1e-4, "requested_by": "olga"},
                   {"id": 4, "kind": "rewind", "requested_by": "olga"},
                   {"id": 5, "kind": "pause", "requested_by": "vic"}]
    poller = ControlPoller(f"{cp.url}/controls", TOKEN)

    assert poller.poll_once() is False
    assert poller.take() == [SetLrControl(id=3, value=1e-4, requested_by="olga"),
                             PauseControl(id=5, requested_by="vic")]
    assert poller.take() == []                     # handed over once
    poller.poll_once()
    assert cp.afters == ["0", "5"] and poller.take() == []


def test_a_bad_config_exits_2_naming_the_field(tmp_path, plane):
    cp = plane()
    bad = json.dumps({"rollout": {"temperature": 9}})
    result = subprocess.run(
        [sys.executable, "-m", "engine.ray_job", "--config-json", bad, "--run-dir",
         str(tmp_path), "--ingest-url", f"{cp.url}/events"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={**os.environ, "RLPLANE_INGEST_TOKEN": "t"})
    assert result.returncode == 2
    assert "rollout.temperature" in result.stderr
    assert cp.events == []


def test_a_missing_token_exits_2(tmp_path, plane, monkeypatch):
    monkeypatch.delenv("RLPLANE_INGEST_TOKEN", raising=False)
    cp = plane()
    argv = ["--config-json", "{}", "--run-dir", str(tmp_path), "--ingest-url", cp.url]
    assert main(argv) == 2


def test_a_fork_from_a_directory_that_is_no_checkpoint_exits_2(tmp_path, plane, token_env):
    cp = plane()
    argv = driver_args(cp, tmp_path / "run", small_run(), "--from-checkpoint",
                       str(tmp_path / "nothing"))
    assert main(argv) == 2



def test_a_run_dir_without_the_control_planes_marker_exits_2_naming_the_shared_mount(
        tmp_path, plane, token_env, capsys):
    """What a Ray node without the shared mount sees: the directory the control plane made
    is not there, so its marker is not either; nothing is written, nothing is posted."""
    cp = plane()
    run_dir = tmp_path / "runs" / "run-7"
    argv = driver_args(cp, run_dir, small_run(), "--run-dir-key", "run 7 created x")

    assert main(argv) == 2

    error = capsys.readouterr().err
    assert f"{run_dir} has no marker" in error
    assert f"RLPLANE_RUNS_DIR ({tmp_path / 'runs'})" in error and "shared storage" in error
    assert not run_dir.exists() and cp.events == []


def test_a_run_dir_marked_for_another_run_exits_2(tmp_path, plane, token_env, capsys):
    cp = plane()
    mark_run_dir(tmp_path / "run-7", "run 7 created yesterday")   # a stale local copy
    argv = driver_args(cp, tmp_path / "run-7", small_run(), "--run-dir-key", "run 7 created x")

    assert main(argv) == 2
    assert "holds the marker of another run" in capsys.readouterr().err


def test_the_control_planes_marker_lets_the_driver_start(tmp_path):
    mark_run_dir(tmp_path / "run-7", "run 7 created x")
    mark_run_dir(tmp_path / "run-7", "run 7 created x")      # a retried submission
    check_run_dir(tmp_path / "run-7", "run 7 created x")
    assert [p.name for p in (tmp_path / "run-7").iterdir()] == [".rlplane-run-dir"]
