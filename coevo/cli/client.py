"""A small HTTP client for the coevo REST API (docs/api.md), used by the remote commands.

Configuration, flags first then the environment:

- ``--url`` / ``COEVO_URL``: the server's root (``https://coevo.example.com``); a URL that
  already ends in ``/api/v1`` is accepted too.
- ``--token`` / ``COEVO_TOKEN``: an API token (``coevo_<prefix>_<secret>``). It is sent only in
  the ``Authorization`` header and never printed, not even in error messages.
- ``--project`` / ``COEVO_PROJECT``: the project slug.

Transient failures are retried with exponential backoff: connection failures (nothing reached
the server), and 502/503/504 (a proxy or a restarting server) and 429 (honouring
``Retry-After``). A read timeout is retried only for GET: a POST that timed out may have been
applied, and retrying it could start a second evaluation.

No Django here: CI runners install the package but only need this client.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urljoin

import httpx

API_PREFIX = "/api/v1/"
RETRY_STATUSES = frozenset({429, 502, 503, 504})

# An indirection so that tests of the retries need not wait.
sleep: Callable[[float], None] = time.sleep


class ApiError(Exception):
    """A request that failed for good: the API's JSON error, or a transport failure."""

    def __init__(
        self,
        message: str,
        *,
        code: str,
        status: int | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.details = details or {}

    def render(self) -> str:
        """The one line shown to users: ``coevo: <message> (<code>)``."""
        return f"coevo: {self.message} ({self.code})"


class ConfigError(ApiError):
    """The client is not configured (no URL, token or project)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code="configuration")


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("server")
    group.add_argument("--url", help="coevo server URL (default: $COEVO_URL)")
    group.add_argument(
        "--token",
        help="API token (default: $COEVO_TOKEN; prefer the variable: flags show up in `ps`)",
    )
    group.add_argument("--project", help="project slug (default: $COEVO_PROJECT)")
    group.add_argument(
        "--request-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="timeout of one HTTP request (default 60)",
    )


@dataclass
class Client:
    base_url: str
    token: str
    project: str
    timeout: float = 60.0
    retries: int = 4
    backoff: float = 0.5
    transport: httpx.BaseTransport | None = None
    root: str = field(default="", init=False)  # the server root, ending in "/"
    api: str = field(default="", init=False)  # the API root, ending in "/api/v1/"
    _http: httpx.Client | None = field(default=None, init=False, repr=False)

    @classmethod
    def from_args(cls, args: argparse.Namespace, **overrides: Any) -> Client:
        url = getattr(args, "url", None) or os.environ.get("COEVO_URL", "")
        token = getattr(args, "token", None) or os.environ.get("COEVO_TOKEN", "")
        project = getattr(args, "project", None) or os.environ.get("COEVO_PROJECT", "")
        missing = [
            name
            for name, value in (
                ("COEVO_URL", url),
                ("COEVO_TOKEN", token),
                ("COEVO_PROJECT", project),
            )
            if not value
        ]
        if missing:
            flags = ", ".join(f"--{name.removeprefix('COEVO_').lower()}" for name in missing)
            raise ConfigError(f"set {', '.join(missing)} (or pass {flags})")
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"COEVO_URL must start with http:// or https://, not {url!r}")
        timeout = getattr(args, "request_timeout", None) or cls.timeout
        return cls(base_url=url, token=token, project=project, timeout=timeout, **overrides)

    def __post_init__(self) -> None:
        root = self.base_url.rstrip("/")
        root = root.removesuffix(API_PREFIX.rstrip("/"))
        self.root = root + "/"
        self.api = root + API_PREFIX

    # -- URLs ------------------------------------------------------------------------------

    def project_url(self, path: str = "") -> str:
        return f"{self.api}projects/{quote(self.project, safe='')}/{path}"

    def absolute(self, url: str) -> str:
        """The API returns absolute URLs; accept relative ones (a proxy may rewrite them)."""
        return urljoin(self.root, url)

    # -- requests --------------------------------------------------------------------------

    def get(self, url: str, **kwargs: Any) -> dict[str, Any]:
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> dict[str, Any]:
        return self.request("POST", url, **kwargs)

    def request(
        self,
        method: str,
        url: str,
        *,
        json: Any = None,
        data: dict[str, str] | None = None,
        files: Callable[[], dict[str, Any]] | None = None,
        params: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Send one request (retrying transient failures) and return the decoded JSON body.

        ``files`` is a factory, so that every attempt gets a fresh, unread file object.
        """
        url = self.absolute(url)
        attempt = 0
        while True:
            attempt += 1
            delay = self.backoff * 2 ** (attempt - 1)
            try:
                response = self._client().request(
                    method,
                    url,
                    json=json,
                    data=data,
                    files=files() if files is not None else None,
                    params=params,
                )
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
                failure: Exception | httpx.Response = exc
            except httpx.TimeoutException as exc:
                if method != "GET":
                    raise ApiError(
                        f"{method} {url} timed out after {self.timeout:g}s; it may still have"
                        " been applied: check before retrying",
                        code="timeout",
                    ) from exc
                failure = exc
            except httpx.TransportError as exc:
                # The connection broke mid-exchange (reset, protocol error).
                if method != "GET":
                    raise ApiError(
                        f"{method} {url} failed: {exc}", code="connection_error"
                    ) from exc
                failure = exc
            else:
                if response.status_code not in RETRY_STATUSES:
                    return self._decode(response)
                failure = response
                retry_after = response.headers.get("Retry-After", "")
                if retry_after.isdigit():
                    delay = max(delay, float(retry_after))
            if attempt > self.retries:
                if isinstance(failure, httpx.Response):
                    return self._decode(failure)
                raise ApiError(
                    f"cannot reach {self.root}: {failure or type(failure).__name__}",
                    code="connection_error",
                ) from failure
            what = (
                f"HTTP {failure.status_code}"
                if isinstance(failure, httpx.Response)
                else str(failure) or type(failure).__name__
            )
            print(
                f"coevo: {method} {url}: {what}; retrying in {delay:g}s ({attempt}/{self.retries})",
                file=sys.stderr,
            )
            sleep(delay)

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _client(self) -> httpx.Client:
        if self._http is None:
            self._http = httpx.Client(
                headers={
                    "Authorization": f"Bearer {self.token}",
                    "Accept": "application/json",
                    "User-Agent": "coevo-cli",
                },
                timeout=httpx.Timeout(self.timeout, connect=min(self.timeout, 10.0)),
                transport=self.transport,
                follow_redirects=False,
            )
        return self._http

    def _decode(self, response: httpx.Response) -> dict[str, Any]:
        try:
            body = response.json() if response.content else {}
        except ValueError:
            body = None
        if response.is_success:
            if body is None:
                raise ApiError(
                    f"{response.request.method} {response.url} answered"
                    f" {response.status_code} with a body that is not JSON",
                    code="bad_response",
                    status=response.status_code,
                )
            return body
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict) and error.get("message"):
            raise ApiError(
                str(error["message"]),
                code=str(error.get("code") or "error"),
                status=response.status_code,
                details=error.get("details") if isinstance(error.get("details"), dict) else {},
            )
        reason = response.reason_phrase or "error"
        raise ApiError(
            f"{response.request.method} {response.url} answered HTTP"
            f" {response.status_code} {reason}",
            code="server_error" if response.status_code >= 500 else f"http_{response.status_code}",
            status=response.status_code,
        )
