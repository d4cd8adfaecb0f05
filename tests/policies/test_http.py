"""The policy client's HTTP (coevo/policies/http.py): kept-alive connections, a stale one
replaced, bounded replies, timeouts, the proxy environment, and no request off its origin."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from coevo.policies.http import JsonHttp, TransportError


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.connections = 0
        self.requests: list[tuple[str, str, dict, bytes]] = []
        self.close_after_reply = False  # without saying so: the client finds out on reuse
        self.reply_bytes = 0
        self.stall_s = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1

    def log_message(self, *args: object) -> None:
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        self.server.requests.append((self.command, self.path, dict(self.headers), body))
        if self.server.stall_s:
            time.sleep(self.server.stall_s)
        reply = (
            b"x" * self.server.reply_bytes
            if self.server.reply_bytes
            else json.dumps({"path": self.path, "echo": body.decode()}).encode()
        )
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)
        if self.server.close_after_reply:
            self.close_connection = True

    do_GET = do_POST = _answer


@pytest.fixture
def server() -> Iterator[_Server]:
    server = _Server()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(autouse=True)
def _no_proxy_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


def test_it_sends_json_and_reads_the_reply_on_one_kept_alive_connection(server: _Server) -> None:
    client = JsonHttp(f"{server.url}/v1", timeout_s=5)
    first = client.request("POST", "/completions", json={"prompt": "héllo", "n": 1})
    second = client.request("GET", f"{server.url}/props")
    client.close()

    assert first.status == 200 and first.json()["path"] == "/v1/completions"
    assert json.loads(first.json()["echo"]) == {"prompt": "héllo", "n": 1}
    assert second.json()["path"] == "/props"
    method, _, headers, _ = server.requests[0]
    assert method == "POST" and headers["Content-Type"] == "application/json"
    assert server.connections == 1


def test_credentials_in_the_url_go_as_basic_auth_and_never_in_the_request_line(
    server: _Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = server.server_address[1]
    client = JsonHttp(f"http://coevo:t%40ken@127.0.0.1:{port}/v1", timeout_s=5)
    client.request("POST", "/completions", json={})
    client.request("GET", f"http://coevo:t%40ken@127.0.0.1:{port}/props")
    for _, path, headers, _ in server.requests:
        assert headers["Authorization"] == "Basic Y29ldm86dEBrZW4="  # coevo:t@ken
        assert "ken" not in path
    # Through a plain proxy too: the absolute URL in the request line has no credentials.
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{port}")
    JsonHttp("http://coevo:t%40ken@policy.invalid:8000/v1", timeout_s=5).request("GET", "/models")
    _, path, headers, _ = server.requests[-1]
    assert path == "http://policy.invalid:8000/v1/models"
    assert headers["Authorization"] == "Basic Y29ldm86dEBrZW4="


def test_a_connection_the_server_closed_is_replaced_without_a_failure(server: _Server) -> None:
    server.close_after_reply = True
    client = JsonHttp(server.url, timeout_s=5)
    for _ in range(3):
        assert client.request("POST", "/completions", json={}).status == 200
    client.close()
    assert server.connections == 3
    assert len(server.requests) == 3  # each request sent once


def test_a_reply_over_the_bound_is_refused(server: _Server) -> None:
    server.reply_bytes = 5000
    client = JsonHttp(server.url, timeout_s=5, max_reply_bytes=4096)
    with pytest.raises(TransportError, match="larger than 4096 bytes"):
        client.request("GET", "/big")
    server.reply_bytes = 0
    assert client.request("GET", "/small").status == 200  # on a new connection


def test_a_server_that_does_not_answer_times_out(server: _Server) -> None:
    server.stall_s = 2
    client = JsonHttp(server.url, timeout_s=0.3)
    started = time.monotonic()
    with pytest.raises(TransportError, match="timed out"):
        client.request("GET", "/slow")
    assert time.monotonic() - started < 1.5


def test_nothing_listening_is_a_transport_error() -> None:
    server = _Server()
    url = server.url
    server.server_close()
    with pytest.raises(TransportError, match="Connection refused"):
        JsonHttp(url, timeout_s=1).request("GET", "/")


def test_threads_share_a_client(server: _Server) -> None:
    client = JsonHttp(server.url, timeout_s=5)
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda i: client.request("POST", f"/c{i}", json=i), range(40)))
    assert sorted(r.json()["path"] for r in replies) == sorted(f"/c{i}" for i in range(40))
    assert server.connections <= 8


def test_it_goes_through_the_proxy_the_environment_names(
    server: _Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The test server stands in for the proxy: a plain proxy gets the absolute URL.
    monkeypatch.setenv("HTTP_PROXY", f"http://user:s%40cret@127.0.0.1:{server.server_address[1]}")
    client = JsonHttp("http://policy.invalid:8000/v1", timeout_s=5)
    assert client.request("POST", "/completions", json={}).status == 200
    _, path, headers, _ = server.requests[-1]
    assert path == "http://policy.invalid:8000/v1/completions"
    assert headers["Proxy-Authorization"] == "Basic dXNlcjpzQGNyZXQ="  # user:s@cret


def test_no_proxy_is_honoured(server: _Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    assert JsonHttp(server.url, timeout_s=5).request("GET", "/").status == 200


def test_an_unsupported_proxy_fails_each_request_without_its_credentials(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "socks5://user:topsecret@proxy.example:1080")
    client = JsonHttp("https://policy.example/v1", timeout_s=5)
    with pytest.raises(TransportError, match="must be an http:// URL") as caught:
        client.request("POST", "/completions", json={})
    assert "topsecret" not in str(caught.value)


def test_it_sends_nothing_off_its_origin(server: _Server) -> None:
    client = JsonHttp(f"{server.url}/v1", timeout_s=5)
    with pytest.raises(ValueError, match="a request off"):
        client.request("GET", "http://169.254.169.254/latest/meta-data/")
    assert server.requests == []
