"""The CLI against a server that wants to turn it on its user (issue 33): a redirect never
carries the API token to another origin, and text the server (or a run's token) wrote
prints inert: no escape sequence, no live rich markup. Fake servers are stdlib http.server
on 127.0.0.1; no Django here."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rlplane import client as c
from rlplane.cli import check_transport, main

HOSTILE = "\x1b]0;pwned\x07\x1b[2J[link=http://evil.example]click[/link]\u202e\x9b31m"


class FakeServer:
    """Answers each (method, path) from ``routes``: a (status, headers, body) tuple;
    records every request's path and Authorization header."""

    def __init__(self, routes: dict):
        self.routes, self.seen = routes, []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                server.seen.append((self.command, self.path,
                                    self.headers.get("Authorization")))
                status, headers, body = server.routes.get(
                    (self.command, self.path.split("?")[0]), (404, {}, {"detail": "no"}))
                data = json.dumps(body).encode()
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = answer

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,),
                         daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def servers(request):
    made = []

    def make(routes):
        made.append(FakeServer(routes))
        return made[-1]

    yield make
    for server in made:
        server.close()


@pytest.fixture(autouse=True)
def config_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("RLPLANE_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.setenv("COLUMNS", "400")  # rich wraps nothing we assert on


def run_row(**fields):
    return {"id": 1, "name": "r", "framework": "rlplane", "status": "stopped",
            "status_reason": "", "priority": 0, "created_by": "olga",
            "created_at": "2026-12-02T10:00:00Z", **fields}


def test_a_redirect_to_another_origin_never_carries_the_token(servers, capsys):
    elsewhere = servers({})
    home = servers({("GET", "/api/v1/runs"): (302, {"Location": elsewhere.url + "/steal"}, {}),
                    ("POST", "/api/v1/runs/1/stop"): (
                        303, {"Location": elsewhere.url + "/steal"}, {})})
    c.save_credentials(home.url, "rlp_secret")

    assert main(["runs"]) == c.EXIT_ERROR
    assert main(["stop", "1"]) == c.EXIT_ERROR

    assert elsewhere.seen == []
    assert [auth for _, _, auth in home.seen] == ["Bearer rlp_secret"] * 2
    err = capsys.readouterr().err
    assert "redirected to another origin" in err and "not sent there" in err


def test_a_redirect_within_the_origin_is_followed(servers, capsys):
    home = servers({("GET", "/api/v1/moved"): (200, {}, [run_row(name="moved-here")])})
    home.routes[("GET", "/api/v1/runs")] = (302, {"Location": home.url + "/api/v1/moved"}, {})
    c.save_credentials(home.url, "rlp_secret")

    assert main(["runs"]) == c.EXIT_OK
    assert "moved-here" in capsys.readouterr().out
    assert [auth for _, _, auth in home.seen] == ["Bearer rlp_secret"] * 2


def test_text_from_a_hostile_server_prints_inert(servers, capsys, monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")   # rich as on a terminal: markup would be live
    alert = {"id": 1, "run": 1, "kind": HOSTILE, "state": "open", "last_step": 3,
             "cause": HOSTILE}
    row = run_row(name=HOSTILE, status_reason=HOSTILE, latest={}, open_alerts=[alert])
    home = servers({
        ("GET", "/api/v1/runs"): (200, {}, [row]),
        ("GET", "/api/v1/runs/1"): (200, {}, row),
        ("POST", "/api/v1/runs/1/stop"): (200, {}, row),
        ("GET", "/api/v1/alerts"): (200, {}, [alert]),
        ("GET", "/api/v1/runs/1/events"): (200, {}, {"last_seq": 2, "events": [
            {"seq": 1, "type": "log", "message": HOSTILE + "\nsecond line"},
            {"seq": 2, "type": "run.status", "status": "failed", "message": HOSTILE}]}),
        ("POST", "/api/v1/runs/2/stop"): (409, {}, {"detail": HOSTILE, "errors": [
            {"field": HOSTILE, "message": HOSTILE}]}),
    })
    c.save_credentials(home.url, "rlp_x")

    for argv in (["runs"], ["stop", "1"], ["alerts"], ["logs", "1"],
                 ["watch", "1", "--interval", "0"], ["stop", "2"]):
        main(argv)
    out, err = capsys.readouterr()

    for printed in (out, err):
        assert "\x1b]" not in printed and "\x07" not in printed and "\x9b" not in printed
        assert "\x1b[2J" not in printed and "\u202e" not in printed
    assert out.count("[link=http://evil.example]click[/link]") >= 5  # shown, not followed
    assert "[link=http://evil.example]" in err
    assert "second line" in out


def test_login_refuses_plain_http_to_another_machine_unless_insecure(capsys):
    assert main(["login", "http://rlplane.example.org", "--token", "rlp_x"]) == c.EXIT_USAGE
    assert "unencrypted" in capsys.readouterr().err
    assert not c.credentials_path().exists()

    check_transport("http://10.1.2.3:8000", True)
    assert "warning" in capsys.readouterr().err
    for url in ("https://rlplane.example.org", "http://127.0.0.1:8000", "http://[::1]:80",
                "http://localhost:8000"):
        check_transport(url, False)


def test_the_engines_senders_of_a_run_token_follow_no_redirect_elsewhere(servers):
    """HttpSink, the driver's control poller and rlplane.track share this opener."""
    import urllib.request

    from engine.telemetry.http_sink import CrossOriginRedirect, same_origin_opener

    elsewhere = servers({})
    home = servers({("GET", "/api/runs/1/controls"): (
        302, {"Location": elsewhere.url + "/steal"}, {})})
    request = urllib.request.Request(home.url + "/api/runs/1/controls",
                                     headers={"Authorization": "Bearer run-token"})

    with pytest.raises(CrossOriginRedirect):
        same_origin_opener().open(request, timeout=5)
    assert elsewhere.seen == []
