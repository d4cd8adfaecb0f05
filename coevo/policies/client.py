"""The one client for policy servers: the OpenAI-compatible HTTP API.

Nothing else in coevo speaks HTTP to a model. Sampling parameters are always sent explicitly:
servers' defaults differ (llama.cpp: max_tokens 16, repeat_penalty 1.1; vLLM: the model's
generation_config.json). What a request carries is its endpoint kind's table
(request_tables.py); an ``anthropic`` endpoint is spoken to in its Messages API
(anthropic_api.py). An endpoint's API key goes only into its header (``key_headers``) and is
taken out of any reply text the client quotes (``redact_key``). A 429's or 503's Retry-After
stretches the wait before the next try (at most ``MAX_RETRY_AFTER_S``); a 401 or 403 (the
endpoint's credentials refused, which no harness chooses) is PolicyUnavailable, not a refusal
of the request.
Transient failures (connection errors, timeouts, 408/429/5xx) are retried with exponential
backoff; after the last try they raise PolicyUnavailable, which the worker records as an
``infra_error`` — never as a score. ``Sampling`` and ``Completion`` are the runtime's
(workers/policy.py): a rollout is handed a client and sees only that protocol.

Whether a server is down is for its health probe (``health``: ``GET /v1/models``, the check
beat runs) and for connections that fail, never for what one request was answered: a program
harness chooses its requests, and one that a server answers with HTTP 500 (vLLM, for a
``tool_choice`` it cannot serve) must not take the endpoint from every rollout. So when the
server still answers an error status after the retries, the client probes it at once: a
failed probe is PolicyUnavailable with ``endpoint_down`` (the server is failing); a server that
answers its probe but 500 to this request raises PolicyRequestFailed (the request's fault,
like a 4xx); one that answers its probe but stayed busy (408/429/502/503/504), or answers
something that is not a completion (not JSON, no choices), is PolicyUnavailable without
``endpoint_down`` (an infra_error that leaves the endpoint healthy and counts the rollout's
attempt; only a server that is down is an outage the rollout is forgiven).

``server_info`` and ``token_count`` ask a server what it is, how long its context is and how
many tokens a text takes, where it says (vLLM: ``max_model_len`` in ``/v1/models`` and
``POST /tokenize``; llama.cpp's server: ``/props`` and ``POST /tokenize``; llama-cpp-python:
``POST /extras/tokenize/count``, no context length, which coevo's llama.cpp host adds as
``context_length`` in ``/v1/models``, OpenRouter's name). They are probes: one try each, a short
timeout, and ``None`` for anything a server does not answer, so a caller falls back to an
estimate instead of failing.
"""

from __future__ import annotations

import functools
import json
import logging
import random
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx

from coevo.errors import PolicyRequestFailed, PolicyRequestRejected, PolicyUnavailable
from coevo.policies import anthropic_api
from coevo.policies.concurrency import EndpointLimiter, limiter_slot
from coevo.policies.http import JsonHttp, TransportError, url_without_credentials
from coevo.policies.pricing import PriceSchedule
from coevo.policies.request_tables import request_for_kind, sampling_of
from workers import metrics
from workers.policy import Completion, Sampling

logger = logging.getLogger(__name__)

_RETRY_STATUSES = {408, 409, 425, 429, 500, 502, 503, 504}
# The longest a Retry-After is waited before one retry (a provider's rate limit may name
# minutes; a rollout waits this much a try at most, then tries again).
MAX_RETRY_AFTER_S = 60.0
# The Messages API version coevo's translation speaks (Anthropic's anthropic-version header).
ANTHROPIC_VERSION = "2023-06-01"
PROBE_TIMEOUT_S = 5.0
# Counting a prompt's tokens reads the whole prompt (at most a proposer's workspace, 1 MB).
TOKENIZE_TIMEOUT_S = 20.0


class ServerFlavor:
    """What software answers at an endpoint, as far as its replies show."""

    VLLM = "vllm"
    LLAMA_CPP = "llama.cpp"  # llama.cpp's own server (llama-server)
    LLAMA_CPP_PYTHON = "llama-cpp-python"  # llama_cpp.server (the embedded policy)


# The endpoint kind whose request table a server of each flavor reads (request_tables.py).
FLAVOR_KINDS = {
    ServerFlavor.VLLM: "vllm",
    ServerFlavor.LLAMA_CPP: "llamacpp",
    ServerFlavor.LLAMA_CPP_PYTHON: "llamacpp",
}


@dataclass(frozen=True)
class Health:
    """One health probe's finding: ``up``, else ``reason``, what ``GET /v1/models`` got (a
    connection refused, ``HTTP 503: …``)."""

    up: bool
    reason: str = ""


@dataclass(frozen=True)
class ServerInfo:
    """``flavor``: a ServerFlavor or None (unknown); ``context_tokens``: the context window the
    server reports for the client's model, or None where it does not say."""

    flavor: str | None = None
    context_tokens: int | None = None


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default TLS settings (certifi's CA bundle, or SSL_CERT_FILE / SSL_CERT_DIR),
    built once per process: building them reads and parses the whole CA bundle, about 19 ms
    of CPU, which every rollout paid for its policy client. An SSLContext is safe to share
    between threads."""
    return httpx.create_ssl_context()


class PolicyClient:
    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        timeout_s: float = 300.0,
        retries: int = 4,
        backoff_s: float = 0.5,
        limiter: EndpointLimiter | None = None,
        kind: str = "openai-compatible",
        api_key: str = "",
        retry_after_max_s: float = MAX_RETRY_AFTER_S,
        prices: PriceSchedule | None = None,
    ) -> None:
        self.base_url = normalize_base_url(base_url)
        # What messages, metrics and traces name: the URL without any credentials in it.
        self.shown_url = url_without_credentials(self.base_url)
        self.limiter = limiter
        self.model = model
        self.retries = retries
        self.backoff_s = backoff_s
        # The endpoint's kind: which request parameters it takes (request_tables.py) and how
        # its API key is sent.
        self.kind = kind
        self.retry_after_max_s = retry_after_max_s
        # The endpoint's price rows (coevo/policies/prices.py): each call is priced by the row
        # that applies when it is answered. None: no price, the calls' cost is None.
        self.prices = prices
        # Kept only to take it out of any text a server sends back (a provider's error may
        # quote the key it refused): never in a message, log line, metric or trace.
        self._api_key = api_key
        self._http = JsonHttp(
            self.base_url,
            timeout_s=timeout_s,
            connect_timeout_s=10.0,
            tls=_tls_if(self.base_url),
            headers=key_headers(kind, api_key),
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> PolicyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def models(self) -> list[str]:
        return [m.get("id", "") for m in self.model_entries()]

    def model_entries(self) -> list[dict[str, Any]]:
        """``GET /v1/models``'s entries (vLLM lists loaded LoRA adapters with a ``parent``)."""
        body = self._request("GET", "/models")
        return [m for m in body.get("data", []) if isinstance(m, dict)]

    def health(self, *, timeout_s: float = PROBE_TIMEOUT_S) -> Health:
        """The health probe: ``GET /v1/models``, one try, a short timeout. Down: no answer, a
        status this client retries (408, 429, 500, 502, 503, 504…) or a 200 that is not JSON;
        any other answer is up (a 4xx: something answers, if not as hoped)."""
        try:
            response = self._http.request("GET", "/models", timeout_s=timeout_s)
        except TransportError as exc:
            return Health(up=False, reason=str(exc))
        shown = self._redacted(response.text)
        if response.status in _RETRY_STATUSES:
            return Health(up=False, reason=f"HTTP {response.status}: {shown[:200]}")
        if response.status == 200:
            try:
                response.json()
            except ValueError:
                return Health(up=False, reason=f"response is not JSON: {shown[:200]!r}")
        return Health(up=True)

    def server_info(self) -> ServerInfo:
        """What the server says about itself and this client's model (see the module's doc)."""
        models = self._probe("GET", "/models")
        entries = [m for m in (models or {}).get("data") or [] if isinstance(m, dict)]
        entry = next((m for m in entries if m.get("id") == self.model), None)
        entry = entry or (entries[0] if entries else {})
        if _positive(entry.get("max_model_len")):
            return ServerInfo(ServerFlavor.VLLM, entry["max_model_len"])
        if entry.get("owned_by") == "vllm":
            return ServerInfo(ServerFlavor.VLLM)
        if entry.get("owned_by") == "llamacpp":
            props = self._probe("GET", f"{self._root}/props") or {}
            settings = props.get("default_generation_settings")
            n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
            return ServerInfo(ServerFlavor.LLAMA_CPP, n_ctx if _positive(n_ctx) else None)
        # llama-cpp-python lists its models as owned by "me": its tokenizer route tells it apart.
        context = entry.get("context_length")
        context = context if _positive(context) else None
        counted = self._probe(
            "POST", f"{self._root}/extras/tokenize/count", json={"input": "", "model": self.model}
        )
        if counted is not None and isinstance(counted.get("count"), int):
            return ServerInfo(ServerFlavor.LLAMA_CPP_PYTHON, context)
        return ServerInfo(context_tokens=context)

    def kind_learn(self, flavor: str | None) -> None:
        """Speak to an ``openai-compatible`` endpoint (one known only to speak OpenAI's API) as
        the kind its replies showed it is (``server_info().flavor``) from now on: its request
        table then passes that server's own parameters (a grammar, a JSON schema on
        completions, its sampling knobs at their neutral values). A declared kind stays."""
        if self.kind == "openai-compatible" and flavor in FLAVOR_KINDS:
            self.kind = FLAVOR_KINDS[flavor]

    def token_count(self, text: str, *, flavor: str | None) -> int | None:
        """How many tokens ``text`` is as a prompt, by the server's own tokenizer (None where
        the server of that ``flavor`` has none or did not answer)."""
        if flavor == ServerFlavor.VLLM:
            body = self._probe(
                "POST",
                f"{self._root}/tokenize",
                json={"model": self.model, "prompt": text},
                timeout_s=TOKENIZE_TIMEOUT_S,
            )
            count = (body or {}).get("count")
        elif flavor == ServerFlavor.LLAMA_CPP:
            body = self._probe(
                "POST",
                f"{self._root}/tokenize",
                json={"content": text, "add_special": True},
                timeout_s=TOKENIZE_TIMEOUT_S,
            )
            tokens = (body or {}).get("tokens")
            count = len(tokens) if isinstance(tokens, list) else None
        elif flavor == ServerFlavor.LLAMA_CPP_PYTHON:
            body = self._probe(
                "POST",
                f"{self._root}/extras/tokenize/count",
                json={"input": text, "model": self.model},
                timeout_s=TOKENIZE_TIMEOUT_S,
            )
            count = (body or {}).get("count")
        else:
            return None
        return count if isinstance(count, int) and count >= 0 else None

    @property
    def _root(self) -> str:
        # The servers' own routes (/tokenize, /props, /extras/...) sit beside /v1, not under it.
        return self.base_url.removesuffix("/v1")

    def _probe(
        self, method: str, path: str, *, timeout_s: float = PROBE_TIMEOUT_S, **kwargs: Any
    ) -> dict[str, Any] | None:
        """One try, no retry: the JSON object answered, or None (any error, status or body)."""
        try:
            response = self._http.request(method, path, timeout_s=timeout_s, **kwargs)
        except TransportError as exc:
            logger.info("policy probe %s %s: %s", method, url_without_credentials(path), exc)
            return None
        if response.status != 200:
            return None
        try:
            body = response.json()
        except ValueError:
            return None
        return body if isinstance(body, dict) else None

    def lora_load(self, *, name: str, path: str, replace: bool = False) -> str:
        """vLLM's ``POST /v1/load_lora_adapter`` (needs VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and
        --enable-lora); returns the server's message. vLLM answers plain text, not JSON.

        vLLM refuses a name it already serves (400) unless the request says ``load_inplace``:
        ``replace`` says it, for new weights under a name the server lists with others."""
        body: dict[str, Any] = {"lora_name": name, "lora_path": path}
        if replace:
            body["load_inplace"] = True
        return self._request("POST", "/load_lora_adapter", json=body, text=True)

    def lora_paths(self) -> dict[str, str]:
        """The adapters ``GET /v1/models`` lists, by name: the path each was loaded from (its
        ``root``; "" where the server does not say)."""
        return {
            str(m.get("id")): str(m.get("root") or "")
            for m in self.model_entries()
            if m.get("parent")
        }

    def lora_unload(self, *, name: str) -> str:
        """vLLM's ``POST /v1/unload_lora_adapter``; returns the server's message."""
        return self._request("POST", "/unload_lora_adapter", json={"lora_name": name}, text=True)

    def complete(self, prompt: str, sampling: Sampling) -> Completion:
        return self.forward("completions", {"prompt": prompt, **sampling.as_params()})

    def chat(self, messages: list[dict[str, Any]], sampling: Sampling) -> Completion:
        return self.forward("chat", {"messages": messages, **sampling.as_params()})

    def forward(self, api: str, body: dict[str, Any]) -> Completion:
        """``POST /v1/completions`` (api ``completions``) or ``/v1/chat/completions`` (``chat``)
        with ``body`` as given (tools, response_format, n, logprobs, …) and this client's
        model; the server's reply is kept whole in ``raw`` (every choice, tool calls)."""
        payload, dropped = request_for_kind(
            self.kind, api, {**body, "model": self.model, "stream": False}
        )
        path = "/completions" if api == "completions" else "/chat/completions"
        if self.kind == "anthropic":
            path, payload = "/messages", anthropic_api.request_from_chat(api, payload)
        with limiter_slot(self.limiter):
            started = time.monotonic()
            reply = self._request("POST", path, json=payload)
        latency_ms = int((time.monotonic() - started) * 1000)
        if self.kind == "anthropic" and isinstance(reply, dict):
            reply = anthropic_api.reply_to_chat(reply)
        if not isinstance(reply, dict):
            # It answered: not down (a rollout's attempt counts; an outage would be forgiven
            # and resumed for as long as the server keeps answering so).
            raise PolicyUnavailable(
                f"The policy server answered {path} with {str(reply)[:200]}", endpoint_down=False
            )
        choice = _first_choice(reply)
        metrics.policy_request_observed(
            endpoint=self.shown_url,
            model=self.model,
            api="completions" if api == "completions" else "chat",
            seconds=latency_ms / 1000,
            **_usage(reply),
        )
        if api == "completions":
            text = choice.get("text") or ""
        else:
            text = (choice.get("message") or {}).get("content") or ""
        usage = _usage(reply)
        cached, written = _cached_tokens(reply), _cache_write_tokens(reply)
        price = (
            None
            if self.prices is None
            else self.prices.at(model=self.model, when=datetime.now(UTC))
        )
        return Completion(
            text=text if isinstance(text, str) else "",
            finish_reason=choice.get("finish_reason"),
            latency_ms=latency_ms,
            model=reply.get("model", self.model),
            raw=reply,
            endpoint=self.shown_url,
            sampling=sampling_of(payload),
            dropped=tuple(dropped),
            **usage,
            cached_tokens=cached,
            cache_write_tokens=written,
            cost_usd=(
                None
                if price is None
                else price.cost(cached_tokens=cached, cache_write_tokens=written, **usage)
            ),
            price=None if price is None else price.record(),
        )

    def _request(self, method: str, path: str, *, text: bool = False, **kwargs: Any) -> Any:
        last_error = last_reply = ""
        # The status of the last try when the server answered one to retry; None when the
        # last try got no answer (the connection failed) or a body that is not JSON.
        last_status: int | None = None
        # Whether the last try got an answer (a body that is not JSON): the server is up.
        answered = False
        # How long the last answer asked to wait (a rate limit's Retry-After), if it said.
        retry_after: float | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                metrics.policy_request_failed(
                    endpoint=self.shown_url, model=self.model, path=path, reason="retried"
                )
                delay = self.backoff_s * 2 ** (attempt - 1) * (1 + random.random() / 4)
                if retry_after is not None:
                    delay = min(max(delay, retry_after), self.retry_after_max_s)
                logger.warning(
                    "policy request %s %s failed (%s); retry %d/%d in %.1fs",
                    method,
                    path,
                    last_error,
                    attempt,
                    self.retries,
                    delay,
                )
                time.sleep(delay)
            try:
                response = self._http.request(method, path, **kwargs)
            except TransportError as exc:
                last_error, last_status, answered = str(exc), None, False
                retry_after = None
                continue
            shown = self._redacted(response.text)
            if response.status in _RETRY_STATUSES:
                last_error = f"HTTP {response.status}: {shown[:200]}"
                last_status, last_reply = response.status, shown[:500]
                retry_after = response.retry_after_s
                continue
            if response.status in (401, 403):
                # The endpoint's credentials, which the worker sends and no harness chooses:
                # never the request's fault (an infra_error; the server is up).
                metrics.policy_request_failed(
                    endpoint=self.shown_url, model=self.model, path=path, reason="unavailable"
                )
                raise PolicyUnavailable(
                    f"The policy server at {self.shown_url} refused the endpoint's credentials "
                    f"for {method} {path} (HTTP {response.status}: {shown[:300]}). Set the "
                    "endpoint's API key in the admin (Policy endpoints).",
                    endpoint_down=False,
                )
            if response.status >= 400:
                metrics.policy_request_failed(
                    endpoint=self.shown_url, model=self.model, path=path, reason="rejected"
                )
                raise PolicyRequestRejected(
                    f"The policy server at {self.shown_url} rejected {method} {path} with "
                    f"HTTP {response.status}: {shown[:500]}",
                    status=response.status,
                    reply=shown[:500],
                )
            if text:
                return shown
            try:
                return response.json()
            except ValueError:
                last_error = f"response is not JSON: {shown[:200]!r}"
                last_status, answered = None, True
                retry_after = None
                continue
        gave_up = (
            f"The policy server at {self.shown_url} did not answer {method} {path} after "
            f"{self.retries + 1} tries (last error: {last_error})"
        )
        if last_status is not None:
            raise self._judged(gave_up, method, path, status=last_status, reply=last_reply)
        metrics.policy_request_failed(
            endpoint=self.shown_url, model=self.model, path=path, reason="unavailable"
        )
        raise PolicyUnavailable(
            f"{gave_up}. Check that it is running (COEVO_POLICY_URL).", endpoint_down=not answered
        )

    def _judged(
        self, gave_up: str, method: str, path: str, *, status: int, reply: str
    ) -> PolicyUnavailable | PolicyRequestFailed:
        """What an error status the server kept answering means, by its health probe asked
        now: the server failing, this request failing, or the server busy."""
        health = self.health()
        error: PolicyUnavailable | PolicyRequestFailed
        if not health.up:
            error = PolicyUnavailable(
                f"{gave_up}, and its health probe failed too (GET /models: {health.reason}). "
                "Check that it is running (COEVO_POLICY_URL).",
                endpoint_down=True,
            )
        elif status == 429:
            # A rate limit (a hosted provider's, per key): waited out as it asked, try after
            # try; what remains is capacity, an infra_error, never the candidate's.
            error = PolicyUnavailable(
                f"{gave_up}: rate-limited (HTTP 429), each retry after the wait its "
                f"Retry-After asked (at most {self.retry_after_max_s:.0f}s). Raise the API "
                "key's rate limit or lower the endpoint's max_concurrency.",
                endpoint_down=False,
            )
        elif status == 500:
            error = PolicyRequestFailed(
                f"The policy server at {self.shown_url} failed on {method} {path} with HTTP "
                f"500 on each of {self.retries + 1} tries while it answers its health probe: "
                f"the request is what it cannot serve, not the server that is down (its "
                f"reply: {reply or 'empty'})",
                status=status,
                reply=reply,
            )
        else:
            error = PolicyUnavailable(
                f"{gave_up}, while it answers its health probe: it is up but busy, or a "
                "gateway in front of it fails. Check its load (COEVO_POLICY_URL).",
                endpoint_down=False,
            )
        metrics.policy_request_failed(
            endpoint=self.shown_url,
            model=self.model,
            path=path,
            reason="failed" if isinstance(error, PolicyRequestFailed) else "unavailable",
        )
        return error

    def _redacted(self, text: str) -> str:
        """``text`` with the endpoint's API key taken out."""
        return redact_key(text, self._api_key)


def server_message(reply: str) -> str:
    """What an error body says, in the server's own words: OpenAI's and vLLM's
    ``{"error": {"message"}}``, vLLM's older ``{"message"}``, FastAPI's ``{"detail"}``, or the
    text as it is."""
    try:
        body = json.loads(reply)
    except ValueError:
        return reply
    if isinstance(body, dict):
        error = body.get("error")
        for found in (
            error.get("message") if isinstance(error, dict) else error,
            body.get("message"),
            body.get("detail"),
        ):
            if isinstance(found, str) and found:
                return found
    return reply


def key_headers(kind: str, api_key: str) -> dict[str, str]:
    """The headers that carry an endpoint's API key: Anthropic's ``x-api-key`` (with the
    ``anthropic-version`` its API requires), else OpenAI's ``Authorization: Bearer`` (vLLM's
    and llama.cpp's ``--api-key`` read it too). None without a key, but Anthropic's version."""
    if kind == "anthropic":
        headers = {"anthropic-version": ANTHROPIC_VERSION}
        if api_key:
            headers["x-api-key"] = api_key
        return headers
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def redact_key(text: str, api_key: str) -> str:
    """``text`` with every occurrence of ``api_key`` replaced (a key too short to be one is
    left: replacing a few common characters would garble the text and hide nothing)."""
    if len(api_key) < 8 or api_key not in text:
        return text
    return text.replace(api_key, "[api key]")


def _tls_if(base_url: str) -> ssl.SSLContext | None:
    return tls_context() if base_url.startswith("https:") else None


def normalize_base_url(url: str) -> str:
    """Accept ``http://host:port`` or ``http://host:port/v1``; return the ``/v1`` form."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else f"{url}/v1"


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _first_choice(body: dict[str, Any]) -> dict[str, Any]:
    choices = body.get("choices") or []
    if not choices or not isinstance(choices, list) or not isinstance(choices[0], dict):
        raise PolicyUnavailable(
            f"The policy server answered without choices: {str(body)[:300]}", endpoint_down=False
        )
    return choices[0]


def _usage(body: dict[str, Any]) -> dict[str, int]:
    usage = body.get("usage")
    usage = usage if isinstance(usage, dict) else {}

    def count(key: str) -> int:
        try:
            return max(0, int(usage.get(key) or 0))
        except (TypeError, ValueError):
            return 0

    return {
        "prompt_tokens": count("prompt_tokens"),
        "completion_tokens": count("completion_tokens"),
    }


def _cached_tokens(body: dict[str, Any]) -> int:
    """Prompt tokens served from the provider's prompt cache: OpenAI's (and vLLM's)
    ``usage.prompt_tokens_details.cached_tokens``; 0 where the reply does not say."""
    usage = body.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return _count(cached)


def _cache_write_tokens(body: dict[str, Any]) -> int:
    """Prompt tokens the provider wrote to its prompt cache: Anthropic's
    ``usage.cache_creation_input_tokens``, which an anthropic endpoint's reply keeps in its
    chat usage (anthropic_api.reply_to_chat), as gateways in front of Anthropic's models
    (LiteLLM's) report it too; 0 where the reply does not say."""
    usage = body.get("usage")
    return _count(usage.get("cache_creation_input_tokens") if isinstance(usage, dict) else None)


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        return 0
    return max(0, value)


@dataclass
class Route:
    """One endpoint a routed client may send to. ``prepare`` runs once before its first request
    (say, loading a LoRA adapter); ``on_ok``/``on_down`` report its health back."""

    client: PolicyClient
    name: str
    prepare: Callable[[PolicyClient], None] | None = None
    on_ok: Callable[[], None] | None = None
    on_down: Callable[[str], None] | None = None
    prepared: bool = False


class RoutedPolicyClient:
    """The client for a policy version served by several endpoints, in order of preference.

    It sticks to the first route that answers; when a route cannot answer (PolicyUnavailable,
    after its own retries) it fails over to the next, so a replica that dies mid-rollout costs a
    retry, not the rollout, and reports the route down when its server is failing
    (``endpoint_down``: no connection, or a failed health probe). With no route left it raises
    PolicyUnavailable, with ``endpoint_down`` when every server it tried was down or none was
    healthy: the worker's policy-outage path (attempt forgiven; the evaluation pauses past a
    threshold); without it (a server busy, out of slots) the rollout's attempt counts. A 4xx
    (PolicyRequestRejected), or a 500 the server answers this request alone
    (PolicyRequestFailed), is the request's fault: not retried elsewhere, and the endpoint stays
    healthy.
    """

    def __init__(self, routes: list[Route], *, model: str, unavailable: str = "") -> None:
        self.routes = routes
        self._model = model
        # Why there are no routes at all (every endpoint marked unhealthy), for the error.
        self.unavailable = unavailable
        self._errors: list[str] = []
        # Per failed route, whether its server was down (not busy): the final error's kind.
        self._down: list[bool] = []

    @property
    def model(self) -> str:
        return self._model

    @model.setter
    def model(self, value: str) -> None:
        self._model = value
        for route in self.routes:
            route.client.model = value

    @property
    def base_url(self) -> str:
        return self.routes[0].client.base_url if self.routes else ""

    def close(self) -> None:
        for route in self.routes:
            route.client.close()

    def __enter__(self) -> RoutedPolicyClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def models(self) -> list[str]:
        return self._call(lambda client: client.models())

    # Probes ask the preferred route only, and never fail over: they raise nothing.
    def server_info(self) -> ServerInfo:
        return self.routes[0].client.server_info() if self.routes else ServerInfo()

    def kind_learn(self, flavor: str | None) -> None:
        """``PolicyClient.kind_learn`` on every route (the probe asked the preferred one)."""
        for route in self.routes:
            route.client.kind_learn(flavor)

    def token_count(self, text: str, *, flavor: str | None) -> int | None:
        return self.routes[0].client.token_count(text, flavor=flavor) if self.routes else None

    def complete(self, prompt: str, sampling: Sampling) -> Completion:
        return self._call(lambda client: client.complete(prompt, sampling))

    def chat(self, messages: list[dict[str, Any]], sampling: Sampling) -> Completion:
        return self._call(lambda client: client.chat(messages, sampling))

    def forward(self, api: str, body: dict[str, Any]) -> Completion:
        return self._call(lambda client: client.forward(api, body))

    def _call(self, send: Callable[[PolicyClient], Any]) -> Any:
        while self.routes:
            route = self.routes[0]
            try:
                if not route.prepared:
                    if route.prepare is not None:
                        route.prepare(route.client)
                    route.prepared = True
                try:
                    result = send(route.client)
                except PolicyRequestRejected as exc:
                    if exc.status != 404 or route.prepare is None:
                        raise
                    # The adapter went away after it was checked (the idle unloader raced
                    # this rollout, or vLLM restarted): load it again and retry, once. A
                    # second 404 is the request's own fault.
                    logger.warning("policy endpoint %s: %s; loading it again", route.name, exc)
                    route.prepare(route.client)
                    result = send(route.client)
            except PolicyUnavailable as exc:
                self._errors.append(f"{route.name}: {exc}")
                self._down.append(exc.endpoint_down)
                # Only a server that is failing (no connection, or a failed health probe) is
                # marked down; one that is busy, or will not load an adapter, keeps its health
                # and is only failed over for this request.
                if route.on_down is not None and exc.endpoint_down:
                    route.on_down(str(exc))
                route.client.close()
                self.routes.pop(0)
                if self.routes:
                    logger.warning(
                        "policy endpoint %s failed; failing over to %s",
                        route.name,
                        self.routes[0].name,
                    )
                continue
            if route.on_ok is not None:
                route.on_ok()
                route.on_ok = None  # once per route is enough to clear a stale failure
            return result
        detail = "; ".join(self._errors) or self.unavailable or "no endpoint serves it"
        # The version's servers are down (an outage: the rollout's attempt is not counted) only
        # when each one tried was, or none was healthy to try; one that was busy or out of
        # slots means capacity, not an outage.
        raise PolicyUnavailable(
            f"No policy endpoint could answer for {self._model}: {detail}",
            endpoint_down=all(self._down),
        )
