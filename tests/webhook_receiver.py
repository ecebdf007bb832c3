"""A webhook receiver on 127.0.0.1 for the alert-delivery tests (the webhook policy
refuses loopback unless RLPLANE_WEBHOOK_ALLOW names it)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    """A webhook receiver on 127.0.0.1 that records each POST and answers ``status``."""

    def __init__(self, status: int = 200):
        self.status, self.bodies, self.location = status, [], None
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                if receiver.drop(self):
                    self.close_connection = True
                    return
                length = int(self.headers["Content-Length"])
                receiver.bodies.append(json.loads(self.rfile.read(length)))
                self.send_response(receiver.status)
                if receiver.location:
                    self.send_header("Location", receiver.location)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def drop(self, request) -> bool:
        """True: leave this request unanswered and uncounted (a subclass decides)."""
        return False
