"""The entry point a Ray job runs: one RunConfig, events to the control plane, stop on request.

    python -m engine.ray_job (--config RUN.toml | --config-json JSON) --run-dir DIR
        --ingest-url URL --token-env RLPLANE_INGEST_TOKEN
        [--controls-url URL] [--poll-s S] [--resume] [--from-checkpoint CKPT_DIR]
        [--run-dir-key KEY]

    events -> RunLoop -> FanoutSink(memory, DIR/events.jsonl, HttpSink -> POST ingest-url)
                                                      (DIR/ingest-spool.jsonl while down)
    stop   <- STOP file in DIR, SIGTERM, or a poller thread: GET controls-url?after=ID
              every poll-s with the run's token -> {"stop": true} -> checkpoint, "stopped"
    live   <- the same answer's "controls" (checkpoint now, pause/resume, set_lr,
              set_eval_every, set_rollout_workers), applied by the loop at the next step
              boundary
    shared <- --run-dir-key: DIR's marker must hold KEY (engine.run_dir), or the driver
              exits 2 before writing anything: its node does not see the control plane's
              runs dir, and its checkpoints would be lost to fork and resume
    fork   <- --from-checkpoint copies a parent's step_NNNNNN/ into DIR/checkpoints/ and
              resumes from it; a retried job (same DIR) resumes from its own latest one

The token is read from the environment (the Ray job's runtime_env), never from argv,
which shows up in process lists and the Ray dashboard. Exit status: 0 succeeded or
stopped, 1 failed, 2 bad arguments or config.

Standard library + engine only: this runs inside the Ray job, next to the engine.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import threading
import urllib.parse
import urllib.request
from pathlib import Path

from engine.config import ConfigError, RunConfig, load_config, validate_config
from engine.controls import Control, ControlError, validate_control
from engine.run_dir import RunDirError, check_run_dir
from engine.telemetry.http_sink import same_origin_opener

logger = logging.getLogger("engine.ray_job")


class ControlPoller:
    """Asks the control plane, every ``interval_s`` in a daemon thread, whether the run
    should stop and which live controls (engine.controls) came since the last one it
    received: GET url?after=<id> -> {"stop": bool, "controls": [{"id", "kind", ...}]}.
    ``__call__`` answers stop from the last reply and ``take`` hands over the controls
    received, without blocking the loop. Unreachable or odd answers count as "no stop, no
    controls": a control plane outage must not stop a run; a control that does not
    validate is logged and skipped (the control plane validated it already)."""

    def __init__(self, url: str, token: str, interval_s: float = 2.0,
                 timeout_s: float = 5.0):
        self.url, self._token = url, token
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.after = 0                     # the highest control id received
        self._requested = threading.Event()
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._controls: list[Control] = []
        self._opener = same_origin_opener()  # the run's token follows no redirect elsewhere
        self._thread = threading.Thread(target=self._run, name="control-poller", daemon=True)

    def start(self) -> ControlPoller:
        self._thread.start()
        return self

    def close(self) -> None:
        self._done.set()

    def __call__(self) -> bool:
        return self._requested.is_set()

    def take(self) -> list[Control]:
        with self._lock:
            controls, self._controls = self._controls, []
        return controls

    def poll_once(self) -> bool:
        query = urllib.parse.urlencode({"after": self.after})
        request = urllib.request.Request(
            f"{self.url}{'&' if '?' in self.url else '?'}{query}",
            headers={"Authorization": f"Bearer {self._token}"})
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                answer = json.loads(response.read())
        except (OSError, ValueError) as exc:  # URLError, HTTPError, timeouts; bad JSON
            logger.warning("control poll %s failed (%s); the run goes on", self.url, exc)
            return False
        if not isinstance(answer, dict):
            return self._requested.is_set()
        if answer.get("stop") is True:
            self._requested.set()
        received = answer.get("controls")
        for item in received if isinstance(received, list) else []:
            try:
                control = validate_control(item)
            except ControlError as exc:
                logger.warning("control %r skipped: %s", item, exc)
                if isinstance(item, dict) and isinstance(item.get("id"), int):
                    self.after = max(self.after, item["id"])
                continue
            if control.id > self.after:
                with self._lock:
                    self._controls.append(control)
                self.after = control.id
        return self._requested.is_set()

    def _run(self) -> None:
        while not self._done.is_set() and not self.poll_once():
            self._done.wait(self.interval_s)


def seed_checkpoint(source: Path, run_dir: Path) -> Path:
    """Copy a checkpoint directory into ``run_dir/checkpoints/`` under its own name, so the
    loop's resume finds it. Copied (not linked): the parent keeps pruning its own.
    Written under a temp name and renamed, so a crash never leaves a half copy."""
    if not (source / "state.json").exists():
        raise FileNotFoundError(f"{source} is not a finished checkpoint (no state.json)")
    target = run_dir / "checkpoints" / source.name
    if not target.exists():
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(source, partial)
        partial.rename(target)
    return target


def own_checkpoint(run_dir: Path) -> Path | None:
    """The run directory's latest complete checkpoint, None before its first."""
    from engine.learner.checkpoint import latest_checkpoint

    return latest_checkpoint(run_dir / "checkpoints")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m engine.ray_job")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", type=Path, help="run config, TOML")
    source.add_argument("--config-json", help="run config, JSON text")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--ingest-url", required=True, help="POST events here")
    parser.add_argument("--token-env", default="RLPLANE_INGEST_TOKEN",
                        help="environment variable that holds the run's ingest token")
    parser.add_argument("--controls-url",
                        help="GET ?after=ID -> {\"stop\": bool, \"controls\": [...]}, "
                             "with the run's token")
    parser.add_argument("--poll-s", type=float, default=2.0,
                        help="seconds between two polls of --controls-url")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the latest checkpoint in RUN_DIR/checkpoints")
    parser.add_argument("--from-checkpoint", type=Path,
                        help="start from this checkpoint directory (a fork); implies --resume")
    parser.add_argument("--run-dir-key",
                        help="refuse to start unless RUN_DIR's marker (written by the control "
                             "plane) holds this key: RUN_DIR is on storage both reach")
    return parser.parse_args(argv)


def load_run_config(args: argparse.Namespace) -> RunConfig:
    if args.config is not None:
        return load_config(args.config)
    try:
        data = json.loads(args.config_json)
    except ValueError as exc:
        raise ConfigError([("(json)", f"--config-json is not valid JSON: {exc}")]) from None
    if not isinstance(data, dict):
        raise ConfigError([("(json)", "--config-json must be a JSON object")])
    return validate_config(data)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args = parse_args(argv)
    try:
        cfg = load_run_config(args)
    except (ConfigError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    token = os.environ.get(args.token_env, "")
    if not token:
        print(f"error: the ingest token is not in ${args.token_env}", file=sys.stderr)
        return 2
    run_dir: Path = args.run_dir
    if args.run_dir_key is not None:
        try:
            check_run_dir(run_dir, args.run_dir_key)
        except RunDirError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    run_dir.mkdir(parents=True, exist_ok=True)
    resume = args.resume
    if args.from_checkpoint is not None and own_checkpoint(run_dir) is not None:
        # A fork's driver restarted (run.max_restarts) after saving checkpoints of its own:
        # it resumes from those, and the parent's (pruned since, or deleted with the parent)
        # is not needed again.
        logger.info("resuming from this run's own checkpoints, not %s", args.from_checkpoint)
        resume = True
    elif args.from_checkpoint is not None:
        try:
            seeded = seed_checkpoint(args.from_checkpoint, run_dir)
        except OSError as exc:
            print(f"error: --from-checkpoint: {exc}", file=sys.stderr)
            return 2
        logger.info("starting from checkpoint %s (copied to %s)", args.from_checkpoint, seeded)
        resume = True

    from engine.api import run_local
    from engine.telemetry.http_sink import HttpSink

    sink = HttpSink(args.ingest_url, token, run_dir / "ingest-spool.jsonl")
    poller = None
    if args.controls_url:
        poller = ControlPoller(args.controls_url, token, args.poll_s).start()
    try:
        summary = run_local(cfg, run_dir, sink=sink, resume=resume, stop_requested=poller,
                            take_controls=poller.take if poller is not None else None)
    except Exception:
        logger.exception("run failed")
        return 1
    finally:
        if poller is not None:
            poller.close()
    logger.info("run %s: %s after %d steps (%.0fs)", cfg.name, summary.status,
                summary.steps_done, summary.wall_s)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
