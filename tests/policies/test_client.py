"""PolicyClient: explicit sampling, usage, retries of transient failures, no retry of 4xx."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from coevo.errors import (
    CoevoError,
    PolicyRequestFailed,
    PolicyRequestRejected,
    PolicyUnavailable,
)
from coevo.policies.client import PolicyClient, Sampling, normalize_base_url


@pytest.fixture
def client(scripted_policy) -> Iterator[PolicyClient]:
    with PolicyClient(scripted_policy.url, model="scripted", backoff_s=0.01) as client:
        yield client


@pytest.fixture
def make_client() -> Iterator:
    """Builds PolicyClients (fast backoff unless told otherwise) and closes them afterwards."""
    clients: list[PolicyClient] = []

    def make(url: str, **kwargs) -> PolicyClient:
        kwargs.setdefault("model", "m")
        kwargs.setdefault("backoff_s", 0.01)
        clients.append(PolicyClient(url, **kwargs))
        return clients[-1]

    yield make
    for made in clients:
        made.close()


@pytest.fixture
def sequence_server() -> Iterator:
    """Starts _SequenceServers with the given scripts and stops them afterwards."""
    servers: list[_SequenceServer] = []

    def start(script: list[tuple[int, str]]) -> _SequenceServer:
        servers.append(_SequenceServer(script).__enter__())
        return servers[-1]

    yield start
    for server in servers:
        server.__exit__(None, None, None)


class _SequenceServer:
    """Answers each request with the next (status, body) of a script; the last one repeats."""

    def __init__(self, script: list[tuple[int, str]]) -> None:
        self.script = list(script)
        self.requests: list[tuple[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                outer.requests.append((self.command, self.path))
                status, body = outer.script.pop(0) if len(outer.script) > 1 else outer.script[0]
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = _answer
            do_POST = _answer

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> _SequenceServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


_OK = json.dumps(
    {
        "model": "seq",
        "choices": [{"index": 0, "text": "ok", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1},
    }
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- complete / chat ----------------------------------------------------------------------


def test_it_sends_the_model_the_prompt_and_every_sampling_parameter(client, scripted_policy):
    sampling = Sampling(max_tokens=64, temperature=0.3, top_p=0.9, stop=("\ndef ", "\n#"), seed=7)

    client.complete("def add(a, b):", sampling)

    (request,) = scripted_policy.requests
    assert request == {
        "path": "/v1/completions",
        "model": "scripted",
        "prompt": "def add(a, b):",
        "max_tokens": 64,
        "temperature": 0.3,
        "top_p": 0.9,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "stop": ["\ndef ", "\n#"],
        "seed": 7,
        "stream": False,  # the worker reads whole replies (the boundary streams them on)
    }


def test_it_sends_explicit_defaults_rather_than_the_servers(client, scripted_policy):
    client.complete("x", Sampling())

    (request,) = scripted_policy.requests
    # llama.cpp would otherwise use max_tokens 16 (what each kind adds of its own:
    # test_request_tables.py).
    assert request["max_tokens"] == 256
    assert request["temperature"] == 0.0
    assert request["top_p"] == 1.0
    assert "stop" not in request
    assert "seed" not in request


def test_it_sends_a_seed_of_zero(client, scripted_policy):
    client.complete("x", Sampling(seed=0))

    assert scripted_policy.requests[0]["seed"] == 0


def test_it_returns_the_text_finish_reason_and_usage(client, scripted_policy):
    scripted_policy.rules.append(("def add", "    return a + b\n"))

    completion = client.complete("def add(a, b):\n    '''Sum.'''\n", Sampling())

    assert completion.text == "    return a + b\n"
    assert completion.finish_reason == "stop"
    # The scripted server counts whitespace-separated words.
    assert completion.prompt_tokens == 4
    assert completion.completion_tokens == 4
    assert completion.model == "scripted"
    assert completion.latency_ms >= 0
    assert completion.raw["id"] == "cmpl-test"


def test_it_chats_with_messages(client, scripted_policy):
    scripted_policy.rules.append(("capital", "Paris"))
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "The capital of France?"},
    ]

    completion = client.chat(messages, Sampling(max_tokens=8, seed=1))

    assert completion.text == "Paris"
    assert completion.completion_tokens == 1
    (request,) = scripted_policy.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["messages"] == messages
    assert (request["model"], request["max_tokens"], request["seed"]) == ("scripted", 8, 1)
    # llama.cpp's knob, which an OpenAI-compatible server of another make may refuse.
    assert "repeat_penalty" not in request


def test_it_treats_missing_usage_as_zero_tokens(sequence_server, make_client):
    server = sequence_server([(200, json.dumps({"choices": [{"text": "hi"}]}))])

    completion = make_client(server.url).complete("x", Sampling())

    assert (completion.prompt_tokens, completion.completion_tokens) == (0, 0)
    assert completion.model == "m"
    assert completion.finish_reason is None


def test_it_raises_policy_unavailable_for_an_answer_without_choices(sequence_server, make_client):
    server = sequence_server([(200, json.dumps({"choices": []}))])

    with pytest.raises(PolicyUnavailable, match="without choices") as caught:
        make_client(server.url).complete("x", Sampling())

    # It answered: not down, so the rollout's attempt counts (an outage's would be forgiven
    # for as long as the server kept answering so).
    assert not caught.value.endpoint_down


# --- models -------------------------------------------------------------------------------


def test_it_lists_the_servers_models(client, scripted_policy):
    scripted_policy.model = "gemma-3-270m"

    assert client.models() == ["gemma-3-270m"]


# --- retries ------------------------------------------------------------------------------


def test_it_retries_after_server_errors_and_succeeds(client, scripted_policy):
    scripted_policy.fail_next = 2
    scripted_policy.rules.append(("x", "done"))

    completion = client.complete("x", Sampling())

    assert completion.text == "done"
    assert len(scripted_policy.requests) == 3
    assert scripted_policy.requests[0] == scripted_policy.requests[2]


def test_it_gives_up_after_the_last_retry(scripted_policy, make_client):
    scripted_policy.fail_next = 100
    client = make_client(scripted_policy.url, retries=2)

    with pytest.raises(PolicyUnavailable, match="after 3 tries") as caught:
        client.complete("x", Sampling())

    assert len(scripted_policy.requests) == 3
    assert "HTTP 503" in str(caught.value)
    assert "COEVO_POLICY_URL" in str(caught.value)


def test_it_makes_one_try_without_retries(scripted_policy, make_client):
    scripted_policy.fail_next = 1
    client = make_client(scripted_policy.url, retries=0)

    with pytest.raises(PolicyUnavailable, match="after 1 tries"):
        client.complete("x", Sampling())

    assert len(scripted_policy.requests) == 1


def test_it_raises_policy_unavailable_when_nothing_listens(make_client):
    url = f"http://127.0.0.1:{_free_port()}"
    client = make_client(url, retries=2)

    with pytest.raises(PolicyUnavailable, match="Connection refused") as caught:
        client.complete("x", Sampling())

    assert f"{url}/v1" in str(caught.value)
    assert isinstance(caught.value, CoevoError)


def test_what_people_and_metrics_see_names_the_server_without_its_credentials(
    scripted_policy, make_client
):
    host = scripted_policy.url.removeprefix("http://")
    client = make_client(f"http://coevo:s3cret-token@{host}", model="scripted")
    completion = client.complete("x", Sampling())
    assert completion.endpoint == normalize_base_url(f"http://{host}")

    down = make_client(f"http://coevo:s3cret-token@127.0.0.1:{_free_port()}", retries=0)
    with pytest.raises(PolicyUnavailable) as caught:
        down.complete("x", Sampling())
    assert "s3cret-token" not in str(caught.value)
    assert "127.0.0.1" in str(caught.value)


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504])
def test_it_retries_transient_statuses(sequence_server, make_client, status):
    server = sequence_server([(status, '{"error": "busy"}'), (200, _OK)])

    completion = make_client(server.url).complete("x", Sampling())

    assert completion.text == "ok"
    assert len(server.requests) == 2


def test_it_retries_an_answer_that_is_not_json(sequence_server, make_client):
    server = sequence_server([(200, "<html>starting</html>"), (200, _OK)])

    assert make_client(server.url).complete("x", Sampling()).text == "ok"

    assert len(server.requests) == 2


def test_it_gives_up_on_answers_that_are_never_json(sequence_server, make_client):
    server = sequence_server([(200, "not json")])

    with pytest.raises(PolicyUnavailable, match="not JSON") as caught:
        make_client(server.url, retries=1).complete("x", Sampling())

    assert len(server.requests) == 2
    assert not caught.value.endpoint_down  # it answered


@pytest.mark.parametrize("status", [400, 404, 422])
def test_it_rejects_a_client_error_without_retrying(sequence_server, make_client, status):
    server = sequence_server([(status, '{"error": "bad max_tokens"}'), (200, _OK)])

    with pytest.raises(PolicyRequestRejected) as caught:
        make_client(server.url).complete("x", Sampling())

    assert len(server.requests) == 1
    message = str(caught.value)
    assert f"HTTP {status}" in message
    assert "bad max_tokens" in message
    assert "POST /completions" in message


@pytest.mark.parametrize("status", [401, 403])
def test_refused_credentials_are_the_endpoints_problem_not_the_requests(
    sequence_server, make_client, status
):
    """The worker sends the endpoint's key; no harness chooses it: an infra_error (never the
    candidate's), without retries, and the server (which answered) is not down."""
    server = sequence_server([(status, '{"error": {"message": "Incorrect API key"}}')])

    with pytest.raises(PolicyUnavailable) as caught:
        make_client(server.url).complete("x", Sampling())

    assert not isinstance(caught.value, PolicyRequestRejected)
    assert not caught.value.endpoint_down
    assert len(server.requests) == 1
    assert "Set the endpoint's API key" in str(caught.value)


def test_it_rejects_a_path_the_scripted_server_does_not_serve(scripted_policy, make_client):
    # A base URL pointing at the wrong prefix: the server answers 404, which is not retried.
    client = make_client(scripted_policy.url + "/v2")

    with pytest.raises(PolicyRequestRejected, match="HTTP 404"):
        client.complete("x", Sampling())

    assert len(scripted_policy.requests) == 1


# --- an error status that outlasts the retries: judged by the health probe -----------------

REQUIRED_TOOL = {
    "messages": [{"role": "user", "content": "x"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
    "tool_choice": "required",
}
_MODELS = json.dumps({"object": "list", "data": [{"id": "m"}]})


def test_a_500_to_one_request_while_the_probe_answers_is_that_requests_failure(
    scripted_policy, make_client
):
    scripted_policy.fails_on = {"tool_choice": "required"}
    client = make_client(scripted_policy.url, model="scripted", retries=2)

    with pytest.raises(PolicyRequestFailed) as caught:
        client.forward("chat", REQUIRED_TOOL)

    assert isinstance(caught.value, PolicyRequestRejected)  # handled as the request's fault
    assert caught.value.status == 500
    assert "HTTP 500 on each of 3 tries" in str(caught.value)
    assert "list index out of range" in caught.value.reply
    assert len(scripted_policy.requests) == 3  # a 5xx is still retried as transient
    assert client.chat(REQUIRED_TOOL["messages"], Sampling()).text  # other requests are served


def test_a_500_when_the_health_probe_fails_too_is_the_server_failing(sequence_server, make_client):
    server = sequence_server([(500, '{"error": "engine dead"}')])  # every answer, the probe's too

    with pytest.raises(PolicyUnavailable) as caught:
        make_client(server.url, retries=1).complete("x", Sampling())

    assert caught.value.endpoint_down
    assert "health probe failed too" in str(caught.value) and "HTTP 500" in str(caught.value)
    assert server.requests == [("POST", "/v1/completions")] * 2 + [("GET", "/v1/models")]


@pytest.mark.parametrize("status", [429, 502, 503, 504])
def test_a_busy_server_that_answers_its_probe_is_unavailable_but_not_down(
    sequence_server, make_client, status
):
    server = sequence_server([(status, '{"error": "busy"}')] * 2 + [(200, _MODELS)])

    with pytest.raises(PolicyUnavailable, match="after 2 tries") as caught:
        make_client(server.url, retries=1).complete("x", Sampling())

    assert not caught.value.endpoint_down  # an infra_error, but the endpoint stays healthy
    assert f"HTTP {status}" in str(caught.value)
    assert server.requests[-1] == ("GET", "/v1/models")


def test_no_connection_is_the_server_down_without_a_probe(make_client):
    client = make_client(f"http://127.0.0.1:{_free_port()}", retries=1)

    with pytest.raises(PolicyUnavailable, match="Connection refused") as caught:
        client.complete("x", Sampling())

    assert caught.value.endpoint_down
    assert "health probe" not in str(caught.value)


# --- base URLs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("http://localhost:8080", "http://localhost:8080/v1"),
        ("http://localhost:8080/", "http://localhost:8080/v1"),
        ("http://localhost:8080/v1", "http://localhost:8080/v1"),
        ("http://localhost:8080/v1/", "http://localhost:8080/v1"),
        ("http://localhost:8080/v1//", "http://localhost:8080/v1"),
        ("https://api.example.com/openai", "https://api.example.com/openai/v1"),
        ("https://api.example.com/openai/v1", "https://api.example.com/openai/v1"),
    ],
)
def test_it_normalizes_base_urls(given, expected):
    assert normalize_base_url(given) == expected


@pytest.mark.parametrize("suffix", ["", "/", "/v1/"])
def test_it_reaches_the_server_with_or_without_v1(scripted_policy, suffix):
    root = scripted_policy.url.removesuffix("/v1")

    with PolicyClient(root + suffix, model="scripted") as client:
        assert client.base_url == scripted_policy.url
        assert client.models() == ["scripted"]
        client.complete("x", Sampling())

    assert scripted_policy.requests[0]["path"] == "/v1/completions"
