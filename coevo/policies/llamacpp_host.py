"""The coevo llama.cpp host: one OpenAI-compatible endpoint (kind ``llamacpp``) serving a base
GGUF model and any LoRA adapter loaded at run time.

    python -m coevo.policies.llamacpp_host --model BASE.gguf --alias gemma-3-270m \\
        --adapter-root COEVO_ADAPTER_DIR --port 8089 [--max-adapters 4] [--n-ctx 4096]

It speaks vLLM's runtime-LoRA API, so coevo loads, routes and unloads adapters on it exactly as
on vLLM (coevo/policies/services.py, policy_adapter_ensure):

- ``POST /v1/load_lora_adapter`` ``{"lora_name", "lora_path", "load_inplace"}``: ``lora_path``
  is an installed adapter directory (its ``adapter.gguf`` is loaded) or a ``.gguf`` file inside
  ``--adapter-root``; a name already loaded is refused (400, vLLM's message) unless
  ``load_inplace`` is true, which replaces its weights under the same name;
  answers once the adapter serves (200, text) or why not (400/503, JSON),
  except that why a path was refused, or why llama.cpp could not load a file, goes only to
  the host's log: the caller learns nothing of the host's files.
- ``POST /v1/unload_lora_adapter`` ``{"lora_name"}``.
- ``GET /v1/models``: the base alias and the loaded adapters (``parent``: the base; ``root``:
  the path its load named, as vLLM lists it);
  ``GET /health``: 200 while the base model serves.
- ``POST /v1/completions`` and ``/v1/chat/completions``: to the child serving the body's
  ``model`` (the base when absent; 404 in OpenAI's error format for a name not served).
  Non-streaming only: coevo never streams, and relaying server-sent events through the
  whole-body proxy below would hold them back until the end anyway. What of a request the
  model cannot honour (tools its chat template does not render, ``n`` > 1; see
  coevo/policies/llamacpp_features.py) is answered all the same, and named in the reply's
  ``coevo_degraded`` list, so the trace can say so instead of losing it silently.
- llama-cpp-python's extras (``POST /extras/tokenize``, ``/extras/tokenize/count``,
  ``/extras/detokenize``): to the named model's child when it is loaded, else the base (every
  adapter shares the base's tokenizer, so a count never needs an adapter loaded).

Each model is a ``llama_cpp.server`` child process (coevo/policies/llamacpp_children.py).
Bounds: the request body's size is checked before it is read, every upstream call has a
timeout, and at most ``--max-adapters`` adapter children run (the least recently used idle one
is evicted). It binds 127.0.0.1 unless told otherwise, and stops its children on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import http.client
import json
import logging
import shlex
import signal
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from coevo.policies.llamacpp_children import (
    NAME_PATTERN,
    ChildPool,
    PoolConfig,
    Refused,
    adapter_file_resolve,
)
from coevo.policies.llamacpp_features import (
    DEGRADED_KEY,
    chat_template_read,
    request_adapt,
    template_renders_tools,
)

logger = logging.getLogger("coevo.llamacpp_host")

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024  # a proposer's prompt is at most ~1 MB of text
MAX_REPLY_BYTES = 64 * 1024 * 1024
# A client that opened a connection but sends nothing (or its body slowly) frees its thread.
CLIENT_TIMEOUT_S = 60.0
COMPLETION_PATHS = ("/v1/completions", "/v1/chat/completions")
EXTRAS_PATHS = ("/extras/tokenize", "/extras/tokenize/count", "/extras/detokenize")


class HostServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        *,
        pool: ChildPool,
        adapter_root: Path,
        upstream_timeout_s: float,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        super().__init__(address, _Handler)
        self.pool = pool
        # The base GGUF's chat template, which every child renders (adapters share it).
        self.chat_template = chat_template_read(pool.config.model)
        self.adapter_root = adapter_root
        self.upstream_timeout_s = upstream_timeout_s
        self.max_body_bytes = max_body_bytes


class _Handler(BaseHTTPRequestHandler):
    server: HostServer
    protocol_version = "HTTP/1.1"  # keep-alive: coevo's client reuses its connections
    # Headers and body go out in two writes: with Nagle's algorithm the second waits for the
    # client's delayed ACK of the first, 40 ms on every answer (measured).
    disable_nagle_algorithm = True
    timeout = CLIENT_TIMEOUT_S

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.address_string(), format % args)

    # --- answers -----------------------------------------------------------------------------

    def _send(self, status: int, data: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _json(self, status: int, body: dict[str, Any]) -> None:
        self._send(status, json.dumps(body).encode(), "application/json")

    def _text(self, status: int, text: str) -> None:
        self._send(status, text.encode(), "text/plain; charset=utf-8")

    def _refused(self, refused: Refused) -> None:
        """OpenAI's error format (``error.message``), which vLLM's clients and coevo's show."""
        kind = "invalid_request_error" if refused.status < 500 else "server_error"
        error: dict[str, Any] = {"message": str(refused), "type": kind, "code": refused.code}
        if refused.code == "model_not_found":
            error["param"] = "model"
        elif refused.param:
            error["param"] = refused.param
        self._json(refused.status, {"error": error})

    # --- routes ------------------------------------------------------------------------------

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        pool = self.server.pool
        if path == "/v1/models":
            alias = pool.config.alias
            data = [
                {
                    "id": child.name,
                    "object": "model",
                    "owned_by": "coevo",
                    # An adapter's path as its load named it (vLLM's ``root``), never the
                    # file the host resolved it to.
                    "root": child.source if child.lora is not None else str(pool.config.model),
                    "parent": alias if child.lora is not None else None,
                    # What the client's server_info reads (OpenRouter's name for it too).
                    "context_length": pool.config.n_ctx,
                }
                for child in pool.ready()
            ]
            self._json(200, {"object": "list", "data": data})
        elif path == "/health":
            ok = pool.base_ready()
            self._json(200 if ok else 503, {"status": "ok" if ok else "base model not serving"})
        else:
            self._json(404, {"error": {"message": f"No route GET {path}.", "code": "not_found"}})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        try:
            raw = self._read_body()
            body = _json_object(raw)
            if path == "/v1/load_lora_adapter":
                self._text(200, self._load(body))
            elif path == "/v1/unload_lora_adapter":
                self._text(200, self.server.pool.adapter_unload(name=_name(body)))
            elif path in COMPLETION_PATHS:
                if body.get("stream"):
                    raise Refused(
                        400,
                        "Streaming is not supported by the coevo llama.cpp host: send "
                        '"stream": false (coevo\'s own client always does).',
                    )
                asked_format = body.get("response_format")
                degraded = request_adapt(path, body, template=self.server.chat_template)
                if body.get("response_format") is not asked_format:
                    raw = json.dumps(body).encode()  # translated to what the child honours
                self._forward(
                    str(body.get("model") or self.server.pool.config.alias), raw, degraded
                )
            elif path in EXTRAS_PATHS:
                model = str(body.get("model") or "")
                served = model and self.server.pool.served(model)
                self._forward(model if served else self.server.pool.config.alias, raw)
            else:
                raise Refused(404, f"No route POST {path}.", code="not_found")
        except Refused as refused:
            self._refused(refused)
        except Exception as exc:  # a bug here: answer it, so the client does not wait
            logger.exception("POST %s failed", path)
            self._refused(Refused(500, f"The llama.cpp host failed: {type(exc).__name__}: {exc}"))

    def _read_body(self) -> bytes:
        """The request body, its size checked before a byte of it is read."""
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise Refused(411, "Send the body with a Content-Length, not chunked.")
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0 or length > self.server.max_body_bytes:
            # The unread body would be taken for the next request: end the connection.
            self.close_connection = True
            raise Refused(
                413,
                f"The request body ({self.headers.get('Content-Length')} bytes) is over the "
                f"host's limit of {self.server.max_body_bytes} bytes (--max-body-bytes).",
            )
        return self.rfile.read(length)

    def _load(self, body: dict[str, Any]) -> str:
        name = _name(body)
        if name == self.server.pool.config.alias:
            raise Refused(400, f"`{name}` is the base model's name: give the adapter another.")
        source = str(body.get("lora_path") or "")
        lora = adapter_file_resolve(root=self.server.adapter_root, path=source)
        return self.server.pool.adapter_load(
            name=name, lora=lora, source=source, inplace=body.get("load_inplace") is True
        )

    def _forward(
        self, model: str, raw: bytes, degraded: list[dict[str, str]] | None = None
    ) -> None:
        """Relay the request to ``model``'s child and its answer back, whole (with
        ``degraded`` added to a JSON answer's ``coevo_degraded``)."""
        with self.server.pool.using(model) as child:
            connection = http.client.HTTPConnection(
                "127.0.0.1", child.port, timeout=self.server.upstream_timeout_s
            )
            try:
                connection.request(
                    "POST", self.path, body=raw, headers={"Content-Type": "application/json"}
                )
                reply = connection.getresponse()
                data = reply.read(MAX_REPLY_BYTES + 1)
            except TimeoutError as exc:
                raise Refused(
                    504,
                    f"The llama.cpp server for `{model}` did not answer within "
                    f"{self.server.upstream_timeout_s:.0f}s ({exc}); its log: {child.log_path}",
                ) from exc
            except (OSError, http.client.HTTPException) as exc:
                raise Refused(
                    503,
                    f"The llama.cpp server for `{model}` failed ({type(exc).__name__}: {exc}); "
                    f"it is restarted on the next request. Its log: {child.log_path}",
                ) from exc
            finally:
                connection.close()
        if len(data) > MAX_REPLY_BYTES:
            raise Refused(502, f"The reply for `{model}` is over {MAX_REPLY_BYTES} bytes.")
        if degraded and reply.status == 200:
            data = _with_degraded(data, degraded)
        self._send(reply.status, data, reply.getheader("Content-Type") or "application/json")


def _with_degraded(data: bytes, degraded: list[dict[str, str]]) -> bytes:
    try:
        answer = json.loads(data)
    except ValueError:
        return data  # not a completion: the client says so, with or without the list
    if not isinstance(answer, dict):
        return data
    answer[DEGRADED_KEY] = degraded
    return json.dumps(answer).encode()


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw or b"{}")
    except ValueError as exc:
        raise Refused(400, f"The request body is not JSON: {exc}.") from exc
    if not isinstance(body, dict):
        raise Refused(400, "The request body must be a JSON object.")
    return body


def _name(body: dict[str, Any]) -> str:
    name = body.get("lora_name")
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise Refused(
            400,
            "lora_name must be 1 to 200 letters, digits, '.', '_' or '-', starting with a "
            f"letter or digit (got {str(name)[:100]!r}).",
        )
    return name


# --- the process -----------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m coevo.policies.llamacpp_host", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--model", required=True, type=Path, help="the base model's GGUF file")
    parser.add_argument("--alias", default="gemma-3-270m", help="the base model's served name")
    parser.add_argument(
        "--adapter-root", required=True, type=Path,
        help="adapters are loaded from inside this directory only (COEVO_ADAPTER_DIR)",
    )  # fmt: skip
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8089)
    parser.add_argument("--max-adapters", type=int, default=4)
    parser.add_argument("--n-ctx", type=int, default=4096)
    parser.add_argument("--start-timeout", type=float, default=120.0, help="seconds per child")
    parser.add_argument(
        "--request-timeout", type=float, default=600.0, help="seconds per upstream request"
    )
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    parser.add_argument("--log-dir", type=Path, help="the children's logs (default: a temp dir)")
    parser.add_argument(
        "--child-command",
        default=f"{shlex.quote(sys.executable)} -m llama_cpp.server",
        help="the server program each child runs; llama_cpp.server's flags are appended",
    )
    args = parser.parse_args(argv)
    if not args.model.is_file():
        parser.error(f"--model {args.model} is not a file")
    if not args.adapter_root.is_dir():
        parser.error(f"--adapter-root {args.adapter_root} is not a directory: create it first")
    if args.max_adapters < 1:
        parser.error("--max-adapters must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s llamacpp-host %(levelname)s %(message)s"
    )
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="coevo-llamacpp-host-"))
    pool = ChildPool(
        PoolConfig(
            command=shlex.split(args.child_command),
            model=args.model.resolve(),
            alias=args.alias,
            n_ctx=args.n_ctx,
            log_dir=log_dir,
            max_adapters=args.max_adapters,
            start_timeout_s=args.start_timeout,
        )
    )
    server = HostServer(
        (args.host, args.port),
        pool=pool,
        adapter_root=args.adapter_root.resolve(),
        upstream_timeout_s=args.request_timeout,
        max_body_bytes=args.max_body_bytes,
    )
    template = server.chat_template
    logger.info(
        "the model's chat template: %s",
        "none (llama-cpp-python's llama-2 format, no tools)"
        if template is None
        else ("renders tools" if template_renders_tools(template) else "has no tools"),
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    # Serving at once: /health answers 503 (and /v1/models lists nothing) until the base is up.
    threading.Thread(target=server.serve_forever, daemon=True).start()
    logger.info("serving on http://%s:%s/v1; children's logs in %s", args.host, args.port, log_dir)
    failed: list[Refused] = []

    def start_base() -> None:
        try:
            pool.start_base()
        except Refused as exc:
            logger.error("the base model's server did not start: %s", exc)
            failed.append(exc)
            stop.set()

    # Not on the main thread: a SIGTERM while the base is loading must not wait for it.
    threading.Thread(target=start_base, daemon=True).start()
    while not stop.wait(0.5):  # a short wait: signal handlers run between waits
        pass
    logger.info("stopping")
    server.shutdown()
    server.server_close()
    pool.stop_all()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
