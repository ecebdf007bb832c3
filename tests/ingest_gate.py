"""A small stdlib proxy in front of the control plane's ingest door, for the tests of what
delivers events to it (engine.telemetry.http_sink, rlplane.track): it passes requests on,
or answers them all 500 (``failing``); down() closes its port (connection refused) and up()
opens it again on the same port."""

import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class Gate:
    """Records the seqs of every batch it passed on."""

    def __init__(self, upstream: str):
        self.upstream = upstream
        self.batches: list[list[int]] = []
        self.failing = False
        self.port = 0
        self._server: ThreadingHTTPServer | None = None

    def up(self) -> "Gate":
        gate = self

        class Forward(BaseHTTPRequestHandler):
            def do_GET(self):
                self.answer(*self.forward(None))

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if gate.failing:
                    self.answer(500, b"<h1>Server Error (500)</h1>")
                    return
                status, answer = self.forward(body)
                gate.batches.append([e["seq"] for e in json.loads(body)["events"]])
                self.answer(status, answer)

            def forward(self, body: bytes | None) -> tuple[int, bytes]:
                request = urllib.request.Request(
                    gate.upstream + self.path, data=body, method=self.command,
                    headers={k: self.headers[k] for k in ("Authorization", "Content-Type")
                             if k in self.headers},
                )
                try:
                    with DIRECT.open(request, timeout=30) as response:
                        return response.status, response.read()
                except urllib.error.HTTPError as exc:
                    return exc.code, exc.read()

            def answer(self, status: int, body: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Forward)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.02},
                         daemon=True).start()
        return self

    def down(self) -> "Gate":
        self._server.shutdown()
        self._server.server_close()
        return self

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, run) -> str:
        """Run ``run``'s ingest door behind the gate."""
        return f"{self.base_url}/api/runs/{run.pk}/events"

    def seqs_in_arrival_order(self) -> list[int]:
        return [seq for batch in self.batches for seq in batch]
