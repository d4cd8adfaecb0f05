"""The model boundary: an OpenAI-compatible endpoint the worker serves to one rollout only.

A program harness (harness.toml ``command``) reaches its model here and nowhere else. The
worker listens on a Unix socket in a directory of its own, bound into that rollout's sandbox
only; inside, coevo's launcher forwards 127.0.0.1 of the sandbox's private network namespace to
the socket, and sets ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` for the program. The key is a
capability made for this rollout: worthless elsewhere, and checked on every request.

What is served: ``GET /v1/models`` and ``POST /v1/completions`` and ``/v1/chat/completions``
(with tools, tool_choice, response_format, n, stop, seed and ``stream``; a streamed reply is
the whole reply sent as server-sent events), Anthropic's ``POST /v1/messages`` and OpenAI's
``POST /v1/responses``, each translated to a chat call (workers/anthropic_messages.py,
workers/openai_responses/), and ``POST /v1/messages/count_tokens``. Whatever model a request
names, the rollout's policy version answers. Every call goes through
``BoundaryHandler.model_call`` — the rollout's runner, which counts it against the manifest's
limits and records it — and a refusal is an OpenAI-style error body (Anthropic's shape on
``/v1/messages``). The conversations of the Responses this boundary made are kept here, one
boundary per rollout, so that a ``previous_response_id`` reaches its own rollout's only.

Bounds against a hostile client: a size limit on headers and body; a deadline for each request
to arrive whole (request line, headers, body: ``IO_TIMEOUT_S`` from when its connection began
waiting for it, however it trickles) and as long for each reply to be taken; a bound on open
connections and on calls in flight at once. A body must be UTF-8 JSON whose numbers are finite
and fit in 64 bits, with no lone surrogates. http.server's own refusals, and any failure of the
worker's own code, answer as JSON errors without detail (the worker's log has the traceback).
Nothing here trusts the client beyond the bytes it sends.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import math
import os
import re
import shutil
import socket
import socketserver
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Protocol

from workers import anthropic_messages, openai_requests, openai_responses
from workers.openai_requests import error_body

logger = logging.getLogger(__name__)

SOCKET_NAME = "api.sock"
# coevo's own routes: the suite's environment and helpers (docs/harnesses.md).
ROUTES_PREFIX = "/coevo/v1"
MAX_BODY_BYTES = 4 * 1024 * 1024
# A request must arrive whole within this long of when its connection began waiting for it,
# and a reply be taken within as long: a client that trickles, stalls or never reads is cut.
# (Read when each connection starts, so tests can shorten it.)
IO_TIMEOUT_S = 30.0
# JSON numbers past 64 bits are not portable (RFC 8259 section 6) and no parameter takes one:
# refused here rather than left to policy servers' parsers, which differ.
MAX_JSON_INT = 2**63
# A \uD800-\uDFFF escape: valid only as half of a pair (checked when one occurs).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
MAX_CONNECTIONS = 64
# Calls of one rollout in flight at once; more wait their turn (the endpoint's own
# concurrency bound, in the policy client, holds across rollouts).
MAX_CONCURRENT_CALLS = 8
_POLL_S = 0.05


class BoundaryRefusal(Exception):
    """A request the runner refuses (a limit reached, the policy server down): HTTP ``status``
    with ``body``, an OpenAI-style error."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(body.get("error", {}).get("message", ""))
        self.status = status
        self.body = body


class BoundaryHandler(Protocol):
    model_name: str

    def model_call(
        self, api: str, body: dict[str, Any], *, dropped: list[str], spoken: str | None = None
    ) -> dict[str, Any]:
        """Answer one checked request (``api``: ``chat`` or ``completions``) with the policy
        server's reply, or raise BoundaryRefusal. ``spoken``: the API the harness used when
        the request was translated (``messages``, ``responses``), for the trace."""
        ...

    def check_request(self, api: str, body: Any) -> tuple[dict[str, Any], list[str]]:
        """``openai_requests.check_request`` with the rollout's seed and token budget."""
        ...

    def coevo_call(self, method: str, params: dict[str, Any]) -> Any:
        """``env.reset``, ``env.step`` or ``helper.<name>`` with ``params``; raises
        BoundaryRefusal."""
        ...

    # Optional: ``token_count(text) -> int | None``, the policy server's count of ``text``
    # (count_tokens estimates without it, or when it answers None).


class ModelBoundary:
    """One rollout's endpoint: ``start`` it, bind ``socket_dir`` into the sandbox, ``close``."""

    def __init__(self, *, handler: BoundaryHandler, token: str, parent: Path | None = None) -> None:
        """``parent``: where to make the socket's directory (the system's temporary
        directory by default)."""
        self.handler = handler
        self.token = token
        self.socket_dir = Path(tempfile.mkdtemp(prefix="coevo-boundary-", dir=parent))
        # The sandbox's uid (a random one for root workers) must reach the socket: the
        # directory is searchable and the socket writable by all; the token is the lock.
        os.chmod(self.socket_dir, 0o711)
        self.socket_path = self.socket_dir / SOCKET_NAME
        self.calls = threading.BoundedSemaphore(MAX_CONCURRENT_CALLS)
        self.responses = openai_responses.ResponseStore()
        self._server = _Server(str(self.socket_path), self)
        os.chmod(self.socket_path, 0o777)
        self._thread = threading.Thread(
            # close() waits for the loop's next poll: 0.2 s cost every program rollout ~0.1 s
            # at its end (benchmarks/README.md); 0.05 s is ~20 idle wakeups a second.
            target=self._server.serve_forever,
            kwargs={"poll_interval": _POLL_S},
            daemon=True,
        )

    def start(self) -> ModelBoundary:
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and remove the socket; connections still open are cut."""
        self._server.shutdown()
        self._server.close_connections()
        self._server.server_close()
        self._thread.join(timeout=5)
        shutil.rmtree(self.socket_dir, ignore_errors=True)

    def __enter__(self) -> ModelBoundary:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def authorized(self, headers: Any) -> bool:
        given = ""
        authorization = headers.get("Authorization") or ""
        if authorization.lower().startswith("bearer "):
            given = authorization[7:].strip()
        given = given or headers.get("x-api-key") or headers.get("api-key") or ""
        return hmac.compare_digest(given.encode(), self.token.encode())


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, path: str, boundary: ModelBoundary) -> None:
        self.boundary = boundary
        self.open: set[socket.socket] = set()
        # Connections whose request is still arriving, with the deadline it must arrive by.
        self.reading: dict[socket.socket, float] = {}
        self.open_lock = threading.Lock()
        super().__init__(path, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.open_lock:
            full = len(self.open) >= MAX_CONNECTIONS
            if not full:
                self.open.add(request)
        if full:
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        # Closed under the lock, so that the watchdog never shuts down a descriptor that was
        # closed and reused meanwhile.
        with self.open_lock:
            self.open.discard(request)
            self.reading.pop(request, None)
            super().shutdown_request(request)

    def service_actions(self) -> None:
        """Between polls of serve_forever (every 0.2 s): cut each connection whose request has
        not arrived whole by its deadline. A timeout on each read cannot: a client that sends
        a byte just before each one runs out would hold its connection for ever (slowloris)."""
        now = time.monotonic()
        with self.open_lock:
            for sock in [s for s, deadline in self.reading.items() if deadline <= now]:
                del self.reading[sock]
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver prints the traceback to stderr; the worker's log is the place for it.
        logger.exception("model boundary: a connection failed")

    def close_connections(self) -> None:
        with self.open_lock:
            for sock in self.open:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "coevo-boundary"
    sys_version = ""
    server: _Server
    # http.server's own refusals (a request line too long, say) come before it sets the path,
    # and before it knows the version: they still answer with a status line, as HTTP/1.1.
    path = ""
    default_request_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # the trace records calls
        return

    def address_string(self) -> str:
        return "sandbox"

    def setup(self) -> None:
        self.timeout = IO_TIMEOUT_S
        super().setup()

    def handle_one_request(self) -> None:
        self._replied = False
        self._reading(True)
        try:
            super().handle_one_request()
        except OSError:
            self.close_connection = True  # the client went away, or the watchdog cut it
        except Exception:
            # A failure of the worker's own code: its message or traceback could show the
            # worker's paths or secrets, so the program gets a bare 500 and the log the rest.
            logger.exception("model boundary: a request failed")
            if not self._replied:
                self._json(
                    500,
                    error_body("The worker could not answer this request.", type="server_error"),
                )
            self.close_connection = True
        finally:
            self._reading(False)

    def send_response(self, code: int, message: str | None = None) -> None:
        self._replied = True
        super().send_response(code, message)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a malformed request line, a line or header section too
        long, an unknown method or HTTP version) as JSON like the rest, never an HTML page."""
        self.close_connection = True
        reason = message or self.responses.get(code, ("Refused",))[0]
        self._json(code, error_body(f"{reason[:200]}."))

    def do_GET(self) -> None:
        self._reading(False)
        if not self._authorized():
            return
        if self.path.split("?")[0].rstrip("/") in ("/v1/models", "/models"):
            self._json(200, openai_requests.models_list(self.server.boundary.handler.model_name))
        else:
            self._not_found()

    def do_POST(self) -> None:
        path = self.path.split("?")[0].rstrip("/")
        api = {
            "/v1/chat/completions": "chat",
            "/chat/completions": "chat",
            "/v1/completions": "completions",
            "/completions": "completions",
            anthropic_messages.PATH: "messages",
            anthropic_messages.COUNT_TOKENS_PATH: "count_tokens",
            **dict.fromkeys(openai_responses.PATHS, "responses"),
            ROUTES_PREFIX + "/env/reset": "env.reset",
            ROUTES_PREFIX + "/env/step": "env.step",
        }.get(path)
        if api is None and path.startswith(ROUTES_PREFIX + "/helpers/"):
            api = "helper." + path.removeprefix(ROUTES_PREFIX + "/helpers/")
        if not self._authorized():
            return
        if api is None:
            self._drain_body()
            self._not_found()
            return
        body = self._read_json()
        if body is None:
            return
        if api == "messages":
            self._messages(body)
            return
        if api == "responses":
            self._responses(body)
            return
        if api == "count_tokens":
            self._count_tokens(body)
            return
        if api.startswith(("env.", "helper.")):
            self._coevo(api, body)
            return
        handler = self.server.boundary.handler
        try:
            clean, dropped = handler.check_request(api, body)
        except openai_requests.BadRequest as exc:
            self._json(400, error_body(str(exc), param=exc.param))
            return
        stream, include_usage = openai_requests.wants_stream(body)
        try:
            with self.server.boundary.calls:
                reply = handler.model_call(api, clean, dropped=dropped)
        except BoundaryRefusal as exc:
            self._json(exc.status, exc.body)
            return
        if stream:
            self._stream(openai_requests.stream_events(api, reply, include_usage=include_usage))
        else:
            self._json(200, reply)

    def _messages(self, body: Any) -> None:
        """Anthropic's Messages API: the request translated to a chat one, then checked,
        counted and recorded as one; the reply translated back."""
        handler = self.server.boundary.handler
        try:
            chat, ignored = anthropic_messages.chat_request(body)
            clean, dropped = handler.check_request("chat", chat)
        except openai_requests.BadRequest as exc:
            self._json(400, error_body(str(exc), param=exc.param))
            return
        try:
            with self.server.boundary.calls:
                reply = handler.model_call(
                    "chat", clean, dropped=sorted({*ignored, *dropped}), spoken="messages"
                )
        except BoundaryRefusal as exc:
            self._json(exc.status, exc.body)
            return
        message = anthropic_messages.message(reply, stop_sequences=clean.get("stop"))
        if body.get("stream") is True:
            self._stream(anthropic_messages.stream_events(message))
        else:
            self._json(200, message)

    def _responses(self, body: Any) -> None:
        """OpenAI's Responses API: the request (with the conversation its
        previous_response_id names) translated to a chat one, then checked, counted and
        recorded as one; the reply translated back, and its conversation kept under its id."""
        boundary = self.server.boundary
        handler = boundary.handler
        try:
            request = openai_responses.parse_request(body, history=boundary.responses.get)
            clean, dropped = handler.check_request("chat", request.chat)
        except openai_requests.BadRequest as exc:
            code = exc.code if isinstance(exc, openai_responses.UnknownResponse) else None
            self._json(400, error_body(str(exc), param=exc.param, code=code))
            return
        try:
            with boundary.calls:
                reply = handler.model_call(
                    "chat", clean, dropped=sorted({*request.dropped, *dropped}), spoken="responses"
                )
        except BoundaryRefusal as exc:
            self._json(exc.status, exc.body)
            return
        response_id = openai_responses.new_id("resp")
        whole, said = openai_responses.response(reply, request, clean, response_id=response_id)
        if request.store:
            boundary.responses.put(response_id, [*request.conversation, said])
        if request.stream:
            self._stream(openai_responses.stream_events(whole))
        else:
            self._json(200, whole)

    def _count_tokens(self, body: Any) -> None:
        """Anthropic's count_tokens: no model call, nothing counted against the limits."""
        counter = getattr(self.server.boundary.handler, "token_count", None)
        try:
            counted = anthropic_messages.count_tokens(body, tokenizer=counter)
        except openai_requests.BadRequest as exc:
            self._json(400, error_body(str(exc), param=exc.param))
            return
        self._json(200, counted)

    def _coevo(self, method: str, body: Any) -> None:
        """The suite's environment and helpers (``ctx.env`` and ``ctx.helper`` for programs):
        the body is the call's parameters, the reply its result."""
        if not isinstance(body, dict):
            self._json(400, error_body("The request body must be a JSON object."))
            return
        try:
            result = self.server.boundary.handler.coevo_call(method, body)
        except BoundaryRefusal as exc:
            self._json(exc.status, exc.body)
            return
        self._json(200, result if isinstance(result, dict) else {"result": result})

    def do_PUT(self) -> None:
        self._method_not_allowed()

    # Nothing is tunnelled (CONNECT), echoed (TRACE) or described (OPTIONS, HEAD).
    do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_TRACE = do_CONNECT = do_PUT

    # --- helpers --------------------------------------------------------------------------

    def _authorized(self) -> bool:
        if self.server.boundary.authorized(self.headers):
            return True
        self._drain_body()
        self._json(
            401,
            error_body(
                "Incorrect API key provided: use the OPENAI_API_KEY (or ANTHROPIC_API_KEY) "
                "coevo set for this run.",
                code="invalid_api_key",
            ),
        )
        return False

    def _read_json(self) -> Any:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            self._json(411, error_body("Send the body with a Content-Length, not chunked."))
            self.close_connection = True
            return None
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._json(411, error_body("A Content-Length header is required."))
            self.close_connection = True
            return None
        if length < 0 or length > MAX_BODY_BYTES:
            self._json(413, error_body(f"The request body is larger than {MAX_BODY_BYTES} bytes."))
            self.close_connection = True
            return None
        try:
            raw = self.rfile.read(length)
        except OSError:
            self.close_connection = True
            return None
        if len(raw) < length:
            self.close_connection = True  # cut by the watchdog, or the client gave up
            return None
        self._reading(False)
        try:
            text = raw.decode()
            body = json.loads(
                text, parse_int=_int64, parse_float=_finite_float, parse_constant=_not_json
            )
            if _SURROGATE_ESCAPE.search(text):
                json.dumps(body, ensure_ascii=False).encode()  # a lone one cannot be UTF-8
        except (ValueError, RecursionError):  # (UnicodeError is a ValueError)
            self._json(
                400,
                error_body(
                    "The request body is not valid JSON: UTF-8 text, with finite numbers that "
                    "fit in 64 bits and no lone surrogates."
                ),
            )
            return None
        return body

    def _drain_body(self) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = 0
        if 0 < length <= MAX_BODY_BYTES:
            with contextlib.suppress(OSError):
                self.rfile.read(length)
        elif length:
            self.close_connection = True
        self._reading(False)

    def _not_found(self) -> None:
        self._json(
            404,
            error_body(
                f"{self.command} {self.path.split('?')[0]} is not served here: the boundary "
                "serves /v1/models, /v1/completions, /v1/chat/completions, /v1/responses, "
                "/v1/messages and /v1/messages/count_tokens.",
                code="unknown_url",
            ),
        )

    def _method_not_allowed(self) -> None:
        self._drain_body()
        self.close_connection = True  # (a HEAD's client expects no body after the headers)
        self._json(405, error_body(f"{self.command} is not allowed here."))

    def _reading(self, reading: bool) -> None:
        """Whether this connection's request is still arriving (the watchdog's business)."""
        with self.server.open_lock:
            if reading:
                self.server.reading[self.connection] = time.monotonic() + IO_TIMEOUT_S
            else:
                self.server.reading.pop(self.connection, None)

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        path = self.path.split("?")[0].rstrip("/")
        if status >= 400 and path in (
            anthropic_messages.PATH,
            anthropic_messages.COUNT_TOKENS_PATH,
        ):
            payload = anthropic_messages.error_of(status, payload)  # Anthropic's SDKs read it
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            # Not taken in time (a client that never reads): the next request on this
            # connection would wait as long again.
            self.close_connection = True

    def _stream(self, events: Iterator[bytes]) -> None:
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            for event in events:
                self.wfile.write(event)
            self.wfile.flush()
        except OSError:
            pass
        self.close_connection = True


def _int64(text: str) -> int:
    value = int(text)  # (past 4300 digits Python itself refuses, in linear time)
    if not -MAX_JSON_INT <= value < MAX_JSON_INT:
        raise ValueError("a number past 64 bits")
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError("a number too large for a double")
    return value


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
