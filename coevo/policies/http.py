"""The policy client's HTTP: JSON requests over kept-alive HTTP/1.1 connections, standard
library only.

A worker sends every model call of every rollout through here, and httpx cost about 1.8 ms of
CPU a request in one (its models of URLs, headers, requests and responses, and httpcore's
pool), more than the rest of a model call's handling together. The policy client needs one
thing of HTTP: send a JSON body, read a reply whole. ``http.client`` does that for a fraction.

What httpx did and this keeps: a connect timeout apart from the timeout of each read and write;
credentials in the URL sent as Basic auth;
TLS with the process's one context (``tls_context``); the proxy environment variables
(``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``, ``NO_PROXY``; https through a CONNECT tunnel);
no redirects followed; connections safe to share between threads (a program harness's calls
through the model boundary run concurrently). What it adds: a bound on a reply's size, and
one immediate retry of a request that met a kept-alive connection the server had closed.
Every failure to get a whole reply is a :class:`TransportError`; an HTTP error status is a
:class:`Reply` like any other.
"""

from __future__ import annotations

import base64
import email.utils
import http.client
import json
import ssl
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

# A completion with logprobs for thousands of tokens and several choices is a few MiB.
MAX_REPLY_BYTES = 64 * 1024 * 1024
# Idle connections kept per client (a rollout's client; the boundary runs at most 8 calls of a
# rollout at once).
MAX_IDLE = 8
USER_AGENT = "coevo-policy-client"


class TransportError(Exception):
    """No whole reply: the connection failed, timed out, or the reply was malformed or too
    large."""


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    # The seconds a 429 or 503 asks the client to wait (its Retry-After header, in seconds or
    # as an HTTP date); None when it names none or none that parses.
    retry_after_s: float | None = None

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        """The body as JSON; ValueError if it is not."""
        return json.loads(self.body)


@dataclass(frozen=True)
class _Origin:
    scheme: str
    host: str
    port: int

    @classmethod
    def of(cls, url: urllib.parse.SplitResult) -> _Origin:
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"not an http(s) URL: {url.geturl()!r}")
        return cls(url.scheme, url.hostname, url.port or (443 if url.scheme == "https" else 80))


class JsonHttp:
    """Requests to one origin (``base_url``'s); paths are relative to ``base_url`` or absolute
    URLs of the same origin."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float,
        connect_timeout_s: float = 10.0,
        tls: ssl.SSLContext | None = None,
        max_reply_bytes: int = MAX_REPLY_BYTES,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        parsed = urllib.parse.urlsplit(self.base_url)
        self.origin = _Origin.of(parsed)
        # Credentials in the URL (``http://user:token@host/v1``) go as Basic auth, as httpx
        # sent them; never in the request line.
        self._authorization = _basic(parsed.username, parsed.password)
        # Sent with every request (an API key's header); an Authorization here replaces the
        # URL's credentials.
        self._headers = dict(headers or {})
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_reply_bytes = max_reply_bytes
        self._tls = tls
        self._proxy, self._proxy_error = None, ""
        try:
            self._proxy = _proxy_for(self.origin)
        except ValueError as exc:  # told at each request, where the caller reports failures
            self._proxy_error = str(exc)
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self._closed = False

    def request(
        self, method: str, path: str, *, json: Any = None, timeout_s: float | None = None
    ) -> Reply:
        """Send and read the whole reply; raise TransportError if there is none."""
        if self._proxy_error:
            raise TransportError(self._proxy_error)
        target = self._target(path)
        headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
        if self._authorization:
            headers["Authorization"] = self._authorization
        headers.update(self._headers)
        body = None
        if json is not None:
            body = _json_body(json)
            headers["Content-Type"] = "application/json"
        if self._proxy is not None and self._proxy.authorization and self.origin.scheme == "http":
            headers["Proxy-Authorization"] = self._proxy.authorization
        timeout = self.timeout_s if timeout_s is None else timeout_s
        connection, reused = self._take()
        try:
            try:
                response = self._exchange(connection, method, target, body, headers, timeout)
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                if not reused:
                    raise
                # The server closed the idle connection (a keep-alive timeout): a fresh one.
                connection.close()
                connection, reused = self._new(), False
                response = self._exchange(connection, method, target, body, headers, timeout)
            reply = Reply(
                response.status,
                self._read(response),
                retry_after_s=retry_after_seconds(response.getheader("Retry-After")),
            )
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            raise TransportError(_describe(exc)) from exc
        except TransportError:
            connection.close()
            raise
        if response.will_close:
            connection.close()
        else:
            self._give_back(connection)
        return reply

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def _target(self, path: str) -> str:
        """The request target: a path for the origin, an absolute URL for a plain proxy."""
        url = urllib.parse.urlsplit(path if "://" in path else self.base_url + path)
        if _Origin.of(url) != self.origin:
            origin = f"{self.origin.scheme}://{self.origin.host}:{self.origin.port}"
            raise ValueError(f"a request off {origin}: {url.scheme}://{url.hostname}:{url.port}")
        if self._proxy is not None and self.origin.scheme == "http":
            # The absolute URL without the credentials: they go in the Authorization header.
            absolute = url._replace(path=url.path or "/", fragment="")
            return url_without_credentials(urllib.parse.urlunsplit(absolute))
        return urllib.parse.urlunsplit(("", "", url.path or "/", url.query, ""))

    def _exchange(
        self,
        connection: http.client.HTTPConnection,
        method: str,
        target: str,
        body: bytes | None,
        headers: dict[str, str],
        timeout: float,
    ) -> http.client.HTTPResponse:
        if connection.sock is None:
            connection.connect()  # within connect_timeout_s
        connection.sock.settimeout(timeout)  # each read and write from here on
        connection.request(method, target, body=body, headers=headers)
        return connection.getresponse()

    def _read(self, response: http.client.HTTPResponse) -> bytes:
        body = bytearray()
        while chunk := response.read(min(1 << 20, self.max_reply_bytes + 1 - len(body))):
            body += chunk
            if len(body) > self.max_reply_bytes:
                raise TransportError(f"the reply is larger than {self.max_reply_bytes} bytes")
        return bytes(body)

    def _take(self) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        return self._new(), False

    def _give_back(self, connection: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < MAX_IDLE:
                self._idle.append(connection)
                return
        connection.close()

    def _new(self) -> http.client.HTTPConnection:
        host, port = self.origin.host, self.origin.port
        if self._proxy is not None:
            host, port = self._proxy.host, self._proxy.port
        if self.origin.scheme == "https":
            connection: http.client.HTTPConnection = http.client.HTTPSConnection(
                host, port, timeout=self.connect_timeout_s, context=self._tls
            )
            if self._proxy is not None:
                tunnel_headers = {}
                if self._proxy.authorization:
                    tunnel_headers["Proxy-Authorization"] = self._proxy.authorization
                connection.set_tunnel(self.origin.host, self.origin.port, tunnel_headers)
        else:
            connection = http.client.HTTPConnection(host, port, timeout=self.connect_timeout_s)
        return connection


@dataclass(frozen=True)
class _Proxy:
    host: str
    port: int
    authorization: str


def _proxy_for(origin: _Origin) -> _Proxy | None:
    """The proxy the environment names for this origin, as httpx and curl read it, or None."""
    proxies = urllib.request.getproxies_environment()
    url = proxies.get(origin.scheme) or proxies.get("all")
    if not url or urllib.request.proxy_bypass_environment(f"{origin.host}:{origin.port}"):
        return None
    parsed = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
    if parsed.scheme != "http" or not parsed.hostname:
        raise ValueError(
            f"the proxy for {origin.scheme} requests must be an http:// URL, not a "
            f"{parsed.scheme or 'schemeless'}:// one "
            "(set in the environment: HTTP_PROXY, HTTPS_PROXY or ALL_PROXY)"
        )
    return _Proxy(parsed.hostname, parsed.port or 80, _basic(parsed.username, parsed.password))


def _basic(username: str | None, password: str | None) -> str:
    """The Basic authorization header value for a URL's credentials, or "" without them."""
    if username is None:
        return ""
    user, secret = urllib.parse.unquote(username), urllib.parse.unquote(password or "")
    return "Basic " + base64.b64encode(f"{user}:{secret}".encode()).decode()


def retry_after_seconds(value: str | None) -> float | None:
    """A Retry-After header's wait in seconds (RFC 9110: delay-seconds or an HTTP date), at
    least 0; None for no header or one that is neither."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - time.time())


def url_without_credentials(url: str) -> str:
    """``url`` with any ``user:password@`` taken out (for request lines, and anything people
    or metrics see)."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _json_body(value: Any) -> bytes:
    """As httpx encodes a JSON body (NaN and infinities are not JSON: ValueError)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):  # socket.timeout is TimeoutError
        return f"timed out ({exc})" if str(exc) else "timed out"
    return f"{type(exc).__name__}: {exc}"
