"""An EventSink that delivers events to the control plane's ingest endpoint.

    emit(event) -> queue -> sender thread, one request in flight at a time:

        loop:
            if the spool file exists:   move what is queued to its end, then replay it
                                        oldest first, batch by batch; delete it once all
                                        of it is delivered
            else:                       send the next batch from the queue (batch_size
                                        events, or what arrived within flush_interval_s)
            on failure:                 append the undelivered events to the spool and back
                                        off (doubling up to max_backoff_s), spooling what
                                        arrives meanwhile

    POST <url>  Authorization: Bearer <token>  {"events": [event.to_dict(), ...]}
        200                   delivered
        400 with "errors"     delivered; the server stored the valid events and named the
                              bad ones, which are set aside (never retried)
        400 with "error", 413 the server refuses the batch as a whole (malformed, too
                              large): it is split in halves, and a single event refused
                              alone is set aside
        500                   retried with backoff; after POISON_AFTER 500s in a row for the
                              same batch it is split in halves the same way, and a single
                              event that still gets them is set aside: one event the
                              server cannot store must not hold the run's telemetry forever.
                              Unless the server answers 500 to an empty batch too: then
                              the trouble is the server's (its database away), not the
                              batch's, and the batch is retried as when unreachable
        refused_statuses      (a client's choice, e.g. 401/403/404: a wrong token or run id)
                              with the ingest's own JSON "error": the batch is set aside at
                              once; such a refusal is for good, retrying cannot help
        anything else         (no connection, timeout, 502/503/504, 401/403/404, a 400 that
                              is not the ingest's own JSON, e.g. a host check) retried with
                              backoff, without limit: those say the server is away, not
                              that the batch is bad

An outage is logged when it starts and when delivery resumes, not at every retry.

Set aside = appended to ``<spool>.rejected`` (JSON lines, the server's reason beside each
event), counted in ``set_aside`` and logged as an error, once per reason (a wrong token
refuses every batch alike): nothing is silently dropped.

flush(timeout_s) has the sender try now what is queued: it returns once those events are
delivered or, when that attempt failed, in the spool.

Delivery guarantee: at least once, in emit order. A batch whose answer was lost is sent
again, and the server drops what it already has by (run, seq). While the control plane is
unreachable, events are in the spool file (JSON lines, flushed per write), so they survive
the process dying; a new HttpSink on the same spool path replays them first. Only events
emitted less than flush_interval_s before a crash, while the server is reachable, are in
memory alone. close(timeout_s) delivers what it can in that time and leaves the rest in
the spool.

Redirects are followed only within the URL's origin (scheme, host, port): urllib copies
the Authorization header onto wherever a 30x points, and the run's token must not go
there. A redirect elsewhere is answered like any other HTTP error (retried, never
followed). ``same_origin_opener`` is the one opener every sender of a token uses (this
sink, the driver's control poller, rlplane.track and the rlplane CLI).

Standard library only: this runs inside the Ray job, next to the engine.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.client import HTTPException
from pathlib import Path
from typing import Any

from engine.events import Event
from engine.telemetry.sinks import end_torn_line

logger = logging.getLogger(__name__)

_WAKE = object()  # put on the queue by close() so a waiting sender notices at once
POISON_AFTER = 5  # 500s in a row for one batch before it is split (module docstring)



def origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) with the scheme's default port filled in: what a redirect must
    keep for a token to go along."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:  # a port that is not a number: no origin matches it
        return scheme, "", -1
    return scheme, (parts.hostname or "").lower(), port or {"http": 80, "https": 443}.get(scheme)


class CrossOriginRedirect(urllib.error.HTTPError):
    """A 30x that points at another origin: not followed, so the token stays home."""


class SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        if origin(newurl) != origin(req.full_url):
            raise CrossOriginRedirect(req.full_url, code, newurl, headers, fp)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def same_origin_opener() -> urllib.request.OpenerDirector:
    """The control plane is addressed directly (an HTTP proxy from the environment would
    only add a hop that can fail), and its redirects are followed only within its
    origin."""
    return urllib.request.build_opener(urllib.request.ProxyHandler({}), SameOriginRedirects())

class HttpSink:
    def __init__(self, url: str, token: str, spool_path: str | Path, *, batch_size: int = 200,
                 flush_interval_s: float = 0.5, max_backoff_s: float = 30.0,
                 min_backoff_s: float = 0.1, request_timeout_s: float = 10.0,
                 refused_statuses: frozenset[int] = frozenset()):
        self.url = url
        self.spool_path = Path(spool_path)
        self._token = token
        self._batch_size = batch_size
        self._flush_interval_s = flush_interval_s
        self._max_backoff_s = max_backoff_s
        self._min_backoff_s = min(min_backoff_s, max_backoff_s)
        self._request_timeout_s = request_timeout_s
        self._opener = same_origin_opener()
        self._queue: queue.Queue[Any] = queue.Queue()
        self._spool_pos = 0  # bytes of the spool already delivered
        self._deadline: float | None = None  # set by close()
        self._closed = False
        self.delivered_all = False
        self.set_aside = 0   # events the server refused or could not store (module doc)
        self.rejected_path = self.spool_path.with_name(self.spool_path.name + ".rejected")
        self._server_errors: dict[int | None, int] = {}   # first seq -> 500s in a row
        self._refused_statuses = refused_statuses
        self._reasons_logged: set[str] = set()
        self._failing = False      # in an outage: its first failure was logged
        self._flushes: list[threading.Event] = []   # flush() callers waiting on an attempt
        end_torn_line(self.spool_path)   # the partial line is skipped on replay
        self._thread = threading.Thread(target=self._run, name="http-sink", daemon=True)
        self._thread.start()

    # --- EventSink ------------------------------------------------------------------------

    def emit(self, event: Event) -> None:
        if self._closed:
            raise RuntimeError("HttpSink.emit after close()")
        if not self._thread.is_alive():
            raise RuntimeError("HttpSink's sender thread died; its error is in the log")
        self._queue.put(event.to_dict())  # a snapshot: later changes to the event don't leak

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Have the sender try what is queued now, and wait (at most ``timeout_s``) until
        it is delivered or spooled. True when nothing is left undelivered."""
        if self._closed or not self._thread.is_alive():
            return self.delivered_all
        attempted = threading.Event()
        self._queue.put(attempted)
        attempted.wait(timeout_s)
        return attempted.is_set() and self._queue.empty() and not self.spool_path.exists()

    def close(self, timeout_s: float = 30.0) -> bool:
        """Deliver what can be delivered within ``timeout_s``; the rest stays in the spool.
        True when every event was delivered (and the spool removed)."""
        if not self._closed:
            self._closed = True
            self._deadline = time.monotonic() + timeout_s
            self._queue.put(_WAKE)
        self._thread.join(timeout_s + self._request_timeout_s + 1.0)
        if self._thread.is_alive():
            logger.error("HttpSink: sender still busy after close(%.1fs)", timeout_s)
        return self.delivered_all

    # --- sender thread --------------------------------------------------------------------

    def _run(self) -> None:
        backoff = 0.0
        while not self._past_deadline():
            if self.spool_path.exists():
                self._spool_queued()  # newer events go behind the spooled ones
                ok = self._replay_spool()
            else:
                batch = self._take_batch()
                if not batch:
                    self._flushed()
                    if self._closed:
                        break
                    continue
                done = self._deliver(batch)
                ok = done == len(batch)
                if not ok:
                    self._append_to_spool(batch[done:])
            self._flushed()
            if ok:
                backoff = 0.0
            else:
                backoff = min(max(2 * backoff, self._min_backoff_s), self._max_backoff_s)
                self._wait_spooling(backoff)
        self._spool_queued()
        self.delivered_all = not self.spool_path.exists()
        self._flushed()

    def _past_deadline(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline

    def _take_batch(self) -> list[dict]:
        """Up to batch_size events, or what arrives within flush_interval_s."""
        batch: list[dict] = []
        flush_at = time.monotonic() + self._flush_interval_s
        while len(batch) < self._batch_size:
            timeout = 0.0 if self._closed else max(flush_at - time.monotonic(), 0.0)
            try:
                item = self._queue.get(timeout=timeout)
            except queue.Empty:
                break
            if isinstance(item, threading.Event):
                self._flushes.append(item)
                break                      # flush(): send what came before it now
            if item is not _WAKE:
                batch.append(item)
        return batch

    def _flushed(self) -> None:
        """The flush() callers whose events were just delivered or spooled."""
        for attempted in self._flushes:
            attempted.set()
        self._flushes.clear()

    def _wait_spooling(self, seconds: float) -> None:
        """Back off, moving whatever is emitted meanwhile into the spool (so it survives
        the process dying). close() and flush() cut the wait short to try once more."""
        end = time.monotonic() + seconds
        if self._deadline is not None:
            end = min(end, self._deadline)
        while (remaining := end - time.monotonic()) > 0:
            try:
                item = self._queue.get(timeout=remaining)
            except queue.Empty:
                return
            if isinstance(item, threading.Event):
                self._flushes.append(item)
                item = _WAKE
            if item is _WAKE:
                return
            self._append_to_spool([item, *self._drain_queue()])

    def _drain_queue(self) -> list[dict]:
        items = []
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return items
            if isinstance(item, threading.Event):
                self._flushes.append(item)
            elif item is not _WAKE:
                items.append(item)

    # --- delivery -------------------------------------------------------------------------

    def _deliver(self, events: list[dict], isolating: bool = False) -> int:
        """Send events in order; returns how many from the front are done with (delivered,
        or set aside because the server refused them). The rest are to be retried.
        ``isolating``: these events are half of a batch that kept getting 500s, so a 500
        splits them at once (module docstring)."""
        try:
            status, body = self._post(events)
        except (OSError, HTTPException) as exc:  # URLError, timeouts, resets are OSErrors
            self._failed(f"{self.url} unreachable ({exc})")
            return 0
        key = events[0].get("seq")
        if status != 500:
            self._server_errors.pop(key, None)
        answered = status == 200 or "error" in body or "errors" in body  # the ingest itself
        if self._failing and answered and status != 500:
            self._failing = False
            logger.info("HttpSink: %s answers again", self.url)
        if status in self._refused_statuses and "error" in body:
            for event in events:
                self._set_aside(event, f"{status}: {body['error']}")
            return len(events)
        if status == 200:
            return len(events)
        if status == 400 and isinstance(body.get("errors"), list):
            by_seq = {e.get("seq"): e for e in events}
            for error in body["errors"]:
                self._set_aside(by_seq.get(error.get("seq"), {"seq": error.get("seq")}),
                                f"400: {error.get('error')}")
            return len(events)
        poisoned = status == 500 and (isolating or self._count_server_error(key))
        if poisoned and not self._server_works():
            poisoned = False
        if status == 413 or status == 400 and "error" in body or poisoned:
            if len(events) == 1:
                self._set_aside(events[0], f"{status}: {body.get('error')}")
                return 1
            half = len(events) // 2
            done = self._deliver(events[:half], poisoned)
            return done if done < half else half + self._deliver(events[half:], poisoned)
        self._failed(f"{self.url} answered {status} ({body.get('error')})")
        return 0

    def _failed(self, what: str) -> None:
        """A delivery attempt failed: the first of an outage is logged, the rest retried
        quietly until the server takes events again."""
        if not self._failing:
            self._failing = True
            logger.warning("HttpSink: %s; will retry until it takes events again", what)
        else:
            logger.debug("HttpSink: %s; will retry", what)

    def _server_works(self) -> bool:
        """Whether the server stores an empty batch (module docstring, 500)."""
        try:
            return self._post([])[0] == 200
        except (OSError, HTTPException):
            return False

    def _count_server_error(self, key: int | None) -> bool:
        """One more 500 for the batch starting at seq ``key``; True once it has had
        POISON_AFTER in a row; its halves are then split further on any 500 of theirs."""
        self._server_errors[key] = self._server_errors.get(key, 0) + 1
        if self._server_errors[key] < POISON_AFTER:
            return False
        del self._server_errors[key]
        return True

    def _set_aside(self, event: dict, reason: str) -> None:
        self.set_aside += 1
        if reason not in self._reasons_logged:
            self._reasons_logged.add(reason)
            logger.error("HttpSink: the server refused event %s (%s); set aside in %s, with "
                         "any other refused for this reason", event.get("seq"), reason,
                         self.rejected_path)
        self.rejected_path.parent.mkdir(parents=True, exist_ok=True)
        with self.rejected_path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"reason": reason, "event": event}) + "\n")

    def _post(self, events: list[dict]) -> tuple[int, dict]:
        request = urllib.request.Request(
            self.url, method="POST", data=json.dumps({"events": events}).encode(),
            headers={"Authorization": f"Bearer {self._token}",
                     "Content-Type": "application/json"},
        )
        timeout = self._request_timeout_s
        if self._deadline is not None:
            timeout = max(0.1, min(timeout, self._deadline - time.monotonic()))
        try:
            with self._opener.open(request, timeout=timeout) as response:
                return response.status, _json_object(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, _json_object(exc.read())

    # --- spool ----------------------------------------------------------------------------

    def _append_to_spool(self, events: list[dict]) -> None:
        if not events:
            return
        self.spool_path.parent.mkdir(parents=True, exist_ok=True)
        with self.spool_path.open("a", encoding="utf-8") as f:
            f.write("".join(json.dumps(e) + "\n" for e in events))

    def _spool_queued(self) -> None:
        self._append_to_spool(self._drain_queue())

    def _replay_spool(self) -> bool:
        """Send the spool from where delivery stopped; True once all of it is delivered
        and the file removed. Only this thread writes the spool, so reaching its end means
        nothing is left."""
        while not self._past_deadline():
            lines = self._read_spool()
            if not lines:
                self.spool_path.unlink()
                self._spool_pos = 0
                return True
            events = [event for event, _ in lines if event is not None]
            done = self._deliver(events) if events else 0
            left = done
            for event, size in lines:  # advance past the delivered (and torn) lines
                if event is not None:
                    if left == 0:
                        break
                    left -= 1
                self._spool_pos += size
            if done < len(events):
                return False
            self._spool_queued()
        return False

    def _read_spool(self) -> list[tuple[dict | None, int]]:
        """Up to batch_size lines from the delivery position: (event, byte size) each, with
        None for a line that is not JSON (a torn write), which is logged and skipped."""
        lines: list[tuple[dict | None, int]] = []
        with self.spool_path.open("rb") as f:
            f.seek(self._spool_pos)
            while len(lines) < self._batch_size and (line := f.readline()):
                try:
                    lines.append((json.loads(line), len(line)))
                except ValueError:
                    logger.error("HttpSink: skipping a torn line in %s: %r",
                                 self.spool_path, line[:200])
                    lines.append((None, len(line)))
        return lines


def _json_object(raw: bytes) -> dict:
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
