"""Report a run from any training script to rlplane's control plane.

    run = rlplane.track.init()        # RLPLANE_URL, RLPLANE_RUN_ID, RLPLANE_TOKEN
    for step in range(steps):
        with run.span("rollout", device="gpu0", step=step):
            ...
        run.span("learner", device="gpu0", step=step, start=t0, end=t1)  # timed elsewhere
        run.log(step, {"reward": r, "loss": loss})      # the framework's own names
        run.samples(step, [{"prompt": p, "completion": c, "reward": r}, ...])
        if run.stop_requested:                           # Stop was pressed on the run page
            break
    run.finish()                      # or: with rlplane.track.init() as run: ...

    each call -> an engine event (engine/events.py), seq 1, 2, ... -> HttpSink's queue
      sender thread: POST <url>/api/runs/<id>/events, in batches, Bearer <token>;
                     while the control plane is away or answers 5xx the events wait in
                     <spool_dir>/<server>/run-<id>.jsonl and are replayed in order
      poller thread: GET <url>/api/runs/<id>/controls every controls_interval seconds
                     -> stop_requested

Delivery is engine.telemetry.http_sink.HttpSink, the engine's own, with one difference: an
ingest answer of 401/403/404 (a wrong token or run id) sets the batch aside in
``run-<id>.jsonl.rejected`` instead of retrying it forever.

It never raises into the training loop: only init() raises, for a missing URL, run id or
token. After that, a value or call it cannot report is dropped, counted (``errors``,
``dropped_nonfinite``, ``set_aside``) and logged once. NaN and infinite metric values are
dropped (``track/dropped_nonfinite`` carries the run's count so far, at the step that
dropped one).

Seq across processes: ingest stores an event once by (run, seq), so a process that
restarts a run must number on past what the run already has. init() asks the server
(an empty batch answers with the run's ``last_seq``) and takes the highest of that and
the seqs still in the spool. When the server does not answer, it goes on from
``run-<id>.seq``, where each process reserves its seqs SEQ_BLOCK at a time before using
them (a gap of at most SEQ_BLOCK seqs, which ingest accepts). Not covered: a process on a
machine that never reported the run, started while the server is away, numbers from 1, and
ingest takes its events for replays of those the run has. One process reports a run (rank
0 of a distributed job).

A script that ends without finish() is finished at exit (atexit): "failed", with the
traceback, when an uncaught exception ended it, else "succeeded".

Standard library and engine.events / engine.telemetry.http_sink / engine.metrics only:
no torch, Django or Ray.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import json
import logging
import math
import os
import re
import sys
import threading
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from http.client import HTTPException
from pathlib import Path
from typing import Any

from engine import metrics as M
from engine.events import (
    SAMPLES_PER_EVENT,
    Event,
    LogEvent,
    MetricsEvent,
    RolloutSample,
    RunStatusEvent,
    SamplesEvent,
    SpanEvent,
)
from engine.telemetry.http_sink import HttpSink, same_origin_opener

logger = logging.getLogger(__name__)

URL_ENV, RUN_ID_ENV, TOKEN_ENV = "RLPLANE_URL", "RLPLANE_RUN_ID", "RLPLANE_TOKEN"
SPOOL_DIR_ENV = "RLPLANE_SPOOL_DIR"
SEQ_BLOCK = 1000            # seqs reserved in run-<id>.seq at a time (module docstring)
METRICS_PER_EVENT = 1000    # more names at one step go in several events (ingest takes 2000)
MAX_UNIX_S = 7_258_118_400.0   # ingest's bound on a span's times (2200-01-01)
FINISH_STATUSES = ("succeeded", "failed", "stopped")
REFUSED = frozenset({401, 403, 404})   # the ingest's word on the token or run: for good


class TrackConfigError(ValueError):
    """init() lacks the control plane's URL, the run id or the run's token."""


def init(url: str | None = None, token: str | None = None, run_id: int | str | None = None,
         *, spool_dir: str | Path | None = None, flush_interval: float = 1.0,
         controls_interval: float = 5.0, timeout: float = 5.0) -> Run:
    """Start reporting run ``run_id`` to the control plane at ``url`` with the run's ingest
    token; each left out comes from RLPLANE_URL, RLPLANE_RUN_ID, RLPLANE_TOKEN.

    spool_dir: where undelivered events wait (RLPLANE_SPOOL_DIR, else
    ~/.cache/rlplane/spool). flush_interval: seconds a batch waits to fill.
    controls_interval: seconds between asks whether to stop. timeout: seconds one request
    may take (init() makes one, to learn where the run's seqs go on)."""
    url = url or _required(URL_ENV, "url")
    token = token or _required(TOKEN_ENV, "token")
    run_id = run_id if run_id is not None else _required(RUN_ID_ENV, "run_id")
    if not (str(run_id).isascii() and str(run_id).isdigit()):  # "²".isdigit() too
        raise TrackConfigError(f"run_id must be the run's number (the {RUN_ID_ENV} "
                               f"environment variable), got {run_id!r}")
    return Run(url, token, int(run_id), spool_dir=Path(spool_dir or default_spool_dir()),
               flush_interval=flush_interval, controls_interval=controls_interval,
               timeout=timeout)


def _required(env: str, argument: str) -> str:
    if value := os.environ.get(env):
        return value
    raise TrackConfigError(f"rlplane.track.init() needs {argument}=... or the {env} "
                           f"environment variable")


def default_spool_dir() -> Path:
    if os.environ.get(SPOOL_DIR_ENV):
        return Path(os.environ[SPOOL_DIR_ENV])
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "rlplane" / "spool"


def _never_raises(method):
    """A public call of Run's: an exception is counted and logged once per call and kind,
    and the call answers None (module docstring)."""
    @functools.wraps(method)
    def guarded(self: Run, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            self._problem(f"{method.__name__}:{type(exc).__name__}",
                          f"{method.__name__.strip('_')}() failed ({exc!r}); not reported", exc)
            return None
    return guarded


class Run:
    """A run being reported; made by init()."""

    def __init__(self, url: str, token: str, run_id: int, *, spool_dir: Path,
                 flush_interval: float, controls_interval: float, timeout: float):
        self.url, self.run_id = url.rstrip("/"), run_id
        self.errors = 0              # calls or values that could not be reported
        self.dropped_nonfinite = 0   # NaN / inf metric values (and samples) dropped
        self._token, self._timeout = token, timeout
        self._logged: set[str] = set()
        self._lock = threading.Lock()        # seq order = queue order, across threads
        self._closed = False
        self._opener = same_origin_opener()  # no proxy; redirects only within the origin
        folder = spool_dir / re.sub(r"[^A-Za-z0-9.-]+", "_",
                                    url.split("://", 1)[-1]).strip("_")
        self.spool_path = folder / f"run-{run_id}.jsonl"
        self._seq_path = folder / f"run-{run_id}.seq"
        self.seq = self._resume_seq()        # the last seq used
        self._reserved = self.seq
        self._sink = HttpSink(f"{self.url}/api/runs/{run_id}/events", token, self.spool_path,
                              flush_interval_s=flush_interval, request_timeout_s=timeout,
                              refused_statuses=REFUSED)
        self._controls_after = 0
        self._stop_requested = threading.Event()
        self._poller_done = threading.Event()
        threading.Thread(target=self._poll_loop, args=(controls_interval,), daemon=True,
                         name=f"rlplane-track-controls-{run_id}").start()
        atexit.register(self._at_exit)
        logger.info("rlplane.track: reporting run %s to %s from seq %s (spool %s)",
                    run_id, self.url, self.seq + 1, self.spool_path)
        self._emit(RunStatusEvent(status="running"))

    # --- what a training script calls --------------------------------------------------

    @_never_raises
    def log(self, step: int, metrics: Mapping[str, Any]) -> MetricsEvent | None:
        """Metrics of one step, under any names (the framework's own are mapped to
        rlplane's by the control plane). Values that are not numbers are dropped. The
        event sent (the first, when more than METRICS_PER_EVENT names made several)."""
        step, values = int(step), {}
        for name, value in metrics.items():
            try:
                number = float(value)
            except (TypeError, ValueError):
                self._problem(f"log:value:{name}", f"log(): metric {name!r} is "
                              f"{type(value).__name__}, not a number; dropped")
                continue
            if not math.isfinite(number):
                self.dropped_nonfinite += 1
                self._once("log:nonfinite", f"log(): dropped {name}={number} at step {step}; "
                           "NaN and inf values are dropped, counted in "
                           f"{M.TRACK_DROPPED_NONFINITE}")
                values[M.TRACK_DROPPED_NONFINITE] = float(self.dropped_nonfinite)
                continue
            if not isinstance(name, str) or not name or "\x00" in name or len(name) > 4096:
                self._problem(f"log:name:{name!r:.40}", f"log(): metric name {name!r:.80} "
                              "is not a name ingest takes (1-4096 characters, no NUL)")
                continue
            values[name] = number
        events = [self._emit(MetricsEvent(step=step, values=dict(part)))
                  for part in _chunks(list(values.items()), METRICS_PER_EVENT)]
        return events[0] if events else None

    def span(self, phase: str, device: str = "cpu0", step: int = 0, version: int = 0, *,
             start: float | None = None, end: float | None = None):
        """``phase`` busy on ``device``. As a context manager it times the block (an
        exception inside still records the span, and goes on to the caller); given
        ``start`` and ``end`` (unix seconds), it records that span at once."""
        if start is not None and end is not None:
            self._record_span(phase, start, end, device, step, version)
            return nullcontext()
        return self._timed_span(phase, device, step, version, start)

    @contextmanager
    def _timed_span(self, phase: str, device: str, step: int, version: int,
                    start: float | None) -> Iterator[None]:
        start = time.time() if start is None else start
        try:
            yield
        finally:
            self._record_span(phase, start, time.time(), device, step, version)

    @_never_raises
    def _record_span(self, phase: str, start: float, end: float, device: str, step: int,
                     version: int) -> SpanEvent | None:
        start, end = float(start), float(end)
        if not 0 <= start <= end <= MAX_UNIX_S:
            raise ValueError(f"a span needs 0 <= start <= end in unix seconds, got "
                             f"{start!r}..{end!r}")
        return self._emit(SpanEvent(device=str(device), phase=str(phase), start=start,
                                    end=end, step=int(step), version=int(version)))

    @_never_raises
    def samples(self, step: int, rows: Iterable[Mapping[str, Any]]) -> SamplesEvent | None:
        """Rollouts of one step for the inspector: dicts with ``prompt``, ``completion``,
        ``reward`` and any other field of engine.events.RolloutSample (others are
        dropped). The first SAMPLES_PER_EVENT rows are kept."""
        rows = list(rows)
        if len(rows) > SAMPLES_PER_EVENT:
            self._once("samples:many", f"samples(): {len(rows)} rows at step {step}; the "
                       f"first {SAMPLES_PER_EVENT} of a step are kept")
        kept = [sample for row in rows[:SAMPLES_PER_EVENT]
                if (sample := self._sample(row)) is not None]
        return self._emit(SamplesEvent(step=int(step), samples=kept)) if kept else None

    @_never_raises
    def log_text(self, message: str, level: str = "info") -> LogEvent | None:
        """A line for the run's log panel."""
        return self._emit(LogEvent(level=str(level), message=str(message)))

    @property
    def stop_requested(self) -> bool:
        """True once someone asked the run to stop (the run page's Stop, the CLI, the API);
        the script should end its loop and finish(status="stopped")."""
        return self._stop_requested.is_set()

    @_never_raises
    def flush(self, timeout: float = 30.0) -> bool | None:
        """Try to deliver what was reported so far, now; wait at most ``timeout`` seconds.
        True when all of it is delivered, False when some waits in the spool."""
        return self._sink.flush(timeout)

    @_never_raises
    def finish(self, status: str = "succeeded", reason: str = "",
               timeout: float = 30.0) -> bool | None:
        """Report the run's end, deliver what is left (at most ``timeout`` seconds; the rest
        stays in the spool for a later init() of this run) and stop the threads. True when
        everything was delivered. A second call does nothing."""
        if status not in FINISH_STATUSES:
            self._problem("finish:status", f"finish(status={status!r}): not one of "
                          f"{FINISH_STATUSES}; reported as failed")
            status, reason = "failed", f"finish(status={status!r}) {reason}".strip()
        with self._lock:
            if self._closed:
                return None
            self._emit_locked(RunStatusEvent(status=status, message=str(reason)))
            self._closed = True
        self._poller_done.set()
        atexit.unregister(self._at_exit)
        delivered = self._sink.close(timeout)
        if not delivered:
            logger.warning("rlplane.track: run %s finished with events left in %s; a later "
                           "rlplane.track.init() of this run delivers them", self.run_id,
                           self.spool_path)
        return delivered

    @property
    def set_aside(self) -> int:
        """Events the server refused (a wrong token, an event it cannot store), kept in
        ``<spool>.rejected``."""
        return self._sink.set_aside

    def __enter__(self) -> Run:
        return self

    def __exit__(self, kind, exc, tb) -> None:
        if exc is None:
            self.finish("succeeded")
        elif isinstance(exc, KeyboardInterrupt):
            self.finish("stopped", "interrupted (KeyboardInterrupt)")
        else:
            self.finish("failed", "".join(traceback.format_exception(kind, exc, tb)))

    # --- the control plane ---------------------------------------------------------------

    def _resume_seq(self) -> int:
        """Where this process's seqs go on from (module docstring)."""
        spooled = _last_spooled_seq(self.spool_path)
        stored = self._stored_seq()
        if stored is not None:
            return max(stored, spooled)
        try:
            reserved = int(self._seq_path.read_text())
        except (OSError, ValueError):
            reserved = 0
        return max(reserved, spooled)

    def _stored_seq(self) -> int | None:
        """The run's highest stored seq, from ingest's answer to an empty batch; None when
        the server does not say (the reason is logged)."""
        try:
            answer = self._request("POST", f"/api/runs/{self.run_id}/events", {"events": []})
            return int(answer["last_seq"])
        except urllib.error.HTTPError as exc:
            if exc.code in REFUSED:
                self._refused(exc)
                return None
            reason = f"{exc.code}: {_error_of(exc)}"
        except (OSError, HTTPException, ValueError, KeyError, TypeError) as exc:
            reason = repr(exc)
        self._once("unreachable", f"{self.url} did not say run {self.run_id}'s last seq "
                   f"({reason}); going on from {self._seq_path}, events wait in the spool")
        return None

    def _refused(self, exc: urllib.error.HTTPError) -> None:
        self._problem("refused", f"the control plane refused run {self.run_id}'s token "
                      f"({exc.code}: {_error_of(exc)}); check {TOKEN_ENV} and {RUN_ID_ENV}. "
                      f"Events are set aside in {self.spool_path}.rejected")

    def poll_controls(self) -> bool:
        """Ask now whether the run should stop (the poller thread asks every
        controls_interval seconds); an unanswered ask leaves stop_requested as it was."""
        try:
            answer = self._request("GET", f"/api/runs/{self.run_id}/controls?after="
                                          f"{self._controls_after}")
        except urllib.error.HTTPError as exc:
            if exc.code in REFUSED:
                self._refused(exc)
            else:
                self._once("controls", f"could not ask {self.url} whether run "
                           f"{self.run_id} should stop ({exc.code}); asking again")
            return self.stop_requested
        except (OSError, HTTPException, ValueError) as exc:
            self._once("controls", f"could not ask {self.url} whether run {self.run_id} "
                       f"should stop ({exc!r}); asking again every poll")
            return self.stop_requested
        if isinstance(answer, dict):
            if answer.get("stop") is True:
                self._stop_requested.set()
            ids = [c["id"] for c in answer.get("controls") or ()
                   if isinstance(c, dict) and isinstance(c.get("id"), int)]
            self._controls_after = max([self._controls_after, *ids])
        return self.stop_requested

    def _poll_loop(self, interval: float) -> None:
        while True:
            self.poll_controls()
            if self._poller_done.wait(interval):
                return

    def _request(self, method: str, path: str, body: dict | None = None) -> Any:
        request = urllib.request.Request(
            self.url + path, method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self._token}",
                     "Content-Type": "application/json"})
        with self._opener.open(request, timeout=self._timeout) as response:
            return json.loads(response.read())

    # --- events ----------------------------------------------------------------------------

    def _emit(self, event: Event) -> Event | None:
        with self._lock:
            if self._closed:
                self._once("closed", f"{event.type} after finish() is not reported")
                return None
            return self._emit_locked(event)

    def _emit_locked(self, event: Event) -> Event:
        self.seq += 1
        event.seq, event.ts = self.seq, time.time()
        if self.seq > self._reserved:
            self._reserve(self.seq + SEQ_BLOCK)
        self._sink.emit(event)
        return event

    def _reserve(self, upto: int) -> None:
        """Write ``upto`` to run-<id>.seq before any seq up to it is used (docstring)."""
        self._reserved = upto
        try:
            self._seq_path.parent.mkdir(parents=True, exist_ok=True)
            partial = self._seq_path.with_name(self._seq_path.name + ".partial")
            partial.write_text(str(upto))
            os.replace(partial, self._seq_path)
        except OSError as exc:
            self._problem("reserve", f"could not write {self._seq_path} ({exc!r}); a "
                          "restart that cannot reach the server may reuse seqs")

    def _sample(self, row: Mapping[str, Any]) -> RolloutSample | None:
        """A RolloutSample of a row's known fields, each made its field's type; a row with
        a non-finite reward or advantage is dropped (ingest takes finite numbers only)."""
        unknown = sorted(set(row) - set(SAMPLE_FIELDS))
        if unknown:
            self._once("samples:unknown", f"samples(): fields {unknown} are not "
                       f"RolloutSample's; dropped")
        try:
            values = {name: SAMPLE_FIELDS[name](row[name]) for name in row
                      if name in SAMPLE_FIELDS}
        except (TypeError, ValueError) as exc:
            self._problem("samples:type", f"samples(): dropped a row whose fields are not "
                          f"RolloutSample's types ({exc})")
            return None
        if not all(math.isfinite(values.get(n, 0.0)) for n in ("reward", "advantage")):
            self.dropped_nonfinite += 1
            self._once("samples:nonfinite", "samples(): dropped a row whose reward or "
                       "advantage is NaN or inf")
            return None
        tokens = values.get("tokens", [])
        for name in ("behaviour_logprobs", "learner_logprobs"):   # parallel to the tokens
            given = values.get(name, [])[:len(tokens)]
            values[name] = given + [None] * (len(tokens) - len(given))
        return RolloutSample(**values)

    # --- its own problems ------------------------------------------------------------------

    def _problem(self, key: str, message: str, exc: BaseException | None = None) -> None:
        """Something the script asked for could not be reported: counted in ``errors``."""
        self.errors += 1
        self._once(key, message, exc, level=logging.ERROR)

    def _once(self, key: str, message: str, exc: BaseException | None = None,
              level: int = logging.WARNING) -> None:
        if key not in self._logged:
            self._logged.add(key)
            logger.log(level, "rlplane.track: %s (logged once)", message, exc_info=exc)

    def _at_exit(self) -> None:
        """A script that ends without finish(): failed when it ended on an exception."""
        exc = getattr(sys, "last_value", None)
        if exc is not None:
            self.finish("failed", "".join(traceback.format_exception(exc)))
        else:
            self.finish("succeeded")


def _finite_or_none(value: Any) -> float | None:
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _field_type(field: dataclasses.Field):
    """How a row's value becomes RolloutSample's: the type of the field's default, or of
    a list's items (tokens: text; logprobs: finite floats or None)."""
    if field.name == "tokens":
        return lambda items: [str(t) for t in items]
    if field.name.endswith("logprobs"):
        return lambda items: [_finite_or_none(v) for v in items]
    if field.name == "turns":          # TrajectoryTurn's fields, as mappings
        return lambda items: [dict(t) for t in items]
    return type(field.default)


SAMPLE_FIELDS = {f.name: _field_type(f) for f in dataclasses.fields(RolloutSample)}


def _chunks(items: list, size: int) -> Iterator[list]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _last_spooled_seq(path: Path) -> int:
    """The highest seq in a spool file (0 without one); a torn line is skipped."""
    try:
        lines = path.read_bytes().splitlines()
    except OSError:
        return 0
    seqs = []
    for line in lines:
        try:
            seqs.append(int(json.loads(line)["seq"]))
        except (ValueError, KeyError, TypeError):
            pass
    return max(seqs, default=0)


def _error_of(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(exc.read())["error"])
    except (ValueError, KeyError, TypeError, OSError):
        return exc.reason
