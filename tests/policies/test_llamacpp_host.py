"""The coevo llama.cpp host with scripted children (tests/support/llamacpp_child.py): routing
by model, vLLM's runtime-LoRA API, path checks, bounds, eviction, restarts, shutdown."""

from __future__ import annotations

import logging
import signal
import socket
import sys
import threading
import time

import httpx
import pytest

from coevo.policies.client import PolicyClient, Sampling, ServerFlavor
from tests.support.llamacpp_host import (
    HostProcess,
    alive,
    make_gguf_adapter,
    running_host,
    wait_for,
)


@pytest.fixture
def host(tmp_path):
    with running_host(tmp_path) as host:
        yield host


def post(host, path: str, body: dict) -> httpx.Response:
    return httpx.post(host.url.removesuffix("/v1") + path, json=body, timeout=30)


def load(host, name: str, path: str) -> httpx.Response:
    return post(host, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})


def complete(host, model: str, prompt: str = "hi") -> httpx.Response:
    return post(host, "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 4})


def text(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def served(host) -> list[str]:
    return [m["id"] for m in httpx.get(f"{host.url}/models").json()["data"]]


def test_it_routes_each_request_to_the_child_serving_its_model(host):
    ft1 = make_gguf_adapter(host.adapter_root, "ft1")

    loaded = load(host, "ft1", str(ft1))

    assert loaded.status_code == 200 and "ft1" in loaded.text
    assert text(complete(host, "base-model")) == "from base-model"
    assert text(complete(host, "ft1")) == "from ft1 + adapter.gguf"
    chat = post(host, "/v1/chat/completions", {"model": "ft1", "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    assert chat.json()["choices"][0]["message"]["content"] == "from ft1 + adapter.gguf"
    # No model named: the base answers.
    assert text(post(host, "/v1/completions", {"prompt": "hi"})) == "from base-model"


def test_it_lists_the_base_and_the_loaded_adapters_as_vllm_does(host):
    ft1 = make_gguf_adapter(host.adapter_root, "ft1")
    load(host, "ft1", str(ft1))

    data = httpx.get(f"{host.url}/models").json()["data"]

    assert [(m["id"], m["parent"]) for m in data] == [("base-model", None), ("ft1", "base-model")]
    # The path as the load named it, as vLLM lists it (never the file the host resolved).
    assert data[1]["root"] == str(ft1)
    assert httpx.get(host.url.removesuffix("/v1") + "/health").status_code == 200

    unloaded = post(host, "/v1/unload_lora_adapter", {"lora_name": "ft1"})

    assert unloaded.status_code == 200
    assert served(host) == ["base-model"]


def test_it_answers_coevos_probes_as_llama_cpp_python_does(host):
    """server_info and token_count (the llm-patch proposer's prompt fitting) work through it:
    counted by the named adapter's child when loaded, else by the base (same tokenizer)."""
    with PolicyClient(host.url, model="not-loaded", retries=0) as client:
        info = client.server_info()
        count = client.token_count("three words here", flavor=info.flavor)

    assert info.flavor == ServerFlavor.LLAMA_CPP_PYTHON
    assert count == 3


def test_it_answers_without_waiting_for_the_clients_delayed_ack(host):
    """An answer's headers and body are two writes: with Nagle's algorithm on, the body waited
    for the client's delayed ACK of the headers, 40 ms on every request through the host."""
    with httpx.Client() as client:
        client.get(f"{host.url}/models")  # connected
        started = time.monotonic()
        for _ in range(20):
            client.get(f"{host.url}/models").raise_for_status()
        elapsed = time.monotonic() - started

    assert elapsed < 0.4  # 0.8 s and more with the stall


def test_it_answers_404_in_openais_format_for_a_model_it_does_not_serve(host):
    response = complete(host, "nobody")

    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert "`nobody` does not exist" in error["message"]


def test_it_refuses_adapter_paths_alike_and_logs_why_for_the_operator(host, tmp_path, caplog):
    """Whoever reaches the host learns nothing of its files from a refusal: not where a path
    resolves, whether it exists, nor how a file starts. The operator's log says which."""
    outside = make_gguf_adapter(tmp_path / "elsewhere", "out")
    root = host.adapter_root
    (root / "link").symlink_to(outside)
    (root / "peft").mkdir()
    (root / "peft" / "adapter.gguf").write_bytes(b"PK\3\4 a zip, not GGUF")
    (root / "peft-only").mkdir()
    (root / "peft-only" / "adapter_config.json").write_text("{}")
    cases = {
        f"{root}/../elsewhere/out": "outside the adapter root",
        str(root / "link"): "outside the adapter root",
        str(root / "nothing"): "nothing does not exist",
        str(root / "peft"): "starts with b'PK\\x03\\x04', not b'GGUF'",
        str(root / "peft-only"): "peft-only/adapter.gguf does not exist",
    }
    answers = set()
    for path, reason in cases.items():
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="coevo.policies.llamacpp_children"):
            response = load(host, "ft1", path)

        assert response.status_code == 400
        message = response.json()["error"]["message"]
        assert message.startswith(f"The adapter at {path} was refused: "), message
        answers.add(message.replace(path, "PATH"))
        assert reason in caplog.text, (path, caplog.text)
        assert caplog.records[-1].levelno == logging.WARNING
    (answer,) = answers  # one answer for every reason
    for leak in ("exist", "resolves", str(outside), "elsewhere", "PK", "starts with"):
        assert leak not in answer
    assert "adapter.gguf" in answer  # what an installed adapter needs, for the caller
    assert served(host) == ["base-model"]
    assert len(host.pool.ready()) == 1  # no child was started


@pytest.mark.parametrize(
    "body, reason",
    [
        ({"lora_name": "base-model", "lora_path": "x"}, "is the base model's name"),
        ({"lora_name": "../x", "lora_path": "x"}, "lora_name must be"),
        ({"lora_name": "a" * 201, "lora_path": "x"}, "lora_name must be"),
        ({"lora_path": "x"}, "lora_name must be"),
    ],
)
def test_it_refuses_adapter_names_that_are_not_bounded_slugs_or_the_base(host, body, reason):
    response = post(host, "/v1/load_lora_adapter", body)

    assert response.status_code == 400 and reason in response.json()["error"]["message"]


def test_it_refuses_a_second_load_of_a_name_as_vllm_does(host):
    ft1 = make_gguf_adapter(host.adapter_root, "ft1")
    load(host, "ft1", str(ft1))

    again = load(host, "ft1", str(ft1))

    assert again.status_code == 400
    assert again.json()["error"]["message"] == (
        "The lora adapter 'ft1' has already been loaded. If you want to load the adapter in "
        "place, set 'load_inplace' to True."
    )
    assert again.json()["error"]["param"] == "lora_name"


def test_a_load_in_place_replaces_the_adapters_weights_under_its_name(host):
    ft1 = make_gguf_adapter(host.adapter_root, "ft1")
    retrained = make_gguf_adapter(host.adapter_root, "ft1-retrained")
    load(host, "ft1", str(ft1))
    assert text(complete(host, "ft1")) == "from ft1 + adapter.gguf"
    old = next(c for c in host.pool.ready() if c.name == "ft1")

    replaced = post(
        host,
        "/v1/load_lora_adapter",
        {"lora_name": "ft1", "lora_path": str(retrained), "load_inplace": True},
    )

    assert replaced.status_code == 200, replaced.text
    data = httpx.get(f"{host.url}/models").json()["data"]
    assert [(m["id"], m["root"]) for m in data[1:]] == [("ft1", str(retrained))]
    assert text(complete(host, "ft1")) == "from ft1 + adapter.gguf"
    child = next(c for c in host.pool.ready() if c.name == "ft1")
    assert child.lora == (retrained / "adapter.gguf").resolve()
    # The old weights' process ends once idle.
    wait_for(lambda: old.exited() is not None)


def test_an_adapter_llama_cpp_cannot_load_is_refused_and_its_log_kept_for_the_operator(
    host, caplog
):
    broken = make_gguf_adapter(host.adapter_root, "broken", content=b"BROKEN")

    with caplog.at_level(logging.WARNING, logger="coevo.policies.llamacpp_children"):
        response = load(host, "broken", str(broken))

    assert response.status_code == 400
    assert response.json()["error"]["message"] == (
        "Loading lora broken failed: llama.cpp could not load the adapter. The llama.cpp "
        "host's log says why."
    )
    # llama.cpp's words (which name the resolved file) and the child's log, host-side only.
    logged = caplog.text
    assert "exited with code 1" in logged and "llama_adapter_lora_init: failed" in logged
    assert str(broken / "adapter.gguf") in logged and "broken.log" in logged
    assert served(host) == ["base-model"]


def test_it_unloads_only_loaded_adapters(host):
    assert post(host, "/v1/unload_lora_adapter", {"lora_name": "ft9"}).status_code == 404
    base = post(host, "/v1/unload_lora_adapter", {"lora_name": "base-model"})
    assert base.status_code == 400 and "is the base model" in base.text
    assert served(host) == ["base-model"]


def test_it_refuses_a_body_over_the_limit_before_reading_it(host):
    """Only the headers are sent: a host that tried to read the body would wait for it."""
    port = int(host.url.rsplit(":", 1)[1].removesuffix("/v1"))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 10000000\r\n\r\n"
        )
        reply = b""
        while chunk := sock.recv(4096):  # it answers, then closes the connection
            reply += chunk
    reply = reply.decode()

    assert reply.startswith("HTTP/1.1 413")
    assert "over the host's limit of 65536 bytes" in reply


def test_it_refuses_streaming_deliberately(host):
    response = post(
        host, "/v1/completions", {"model": "base-model", "prompt": "hi", "stream": True}
    )

    assert response.status_code == 400 and '"stream": false' in response.json()["error"]["message"]


def test_it_evicts_the_least_recently_used_adapter_but_never_one_in_flight(host):
    """max_adapters=2: a, then b; a slow request holds a (now the least recently used once b
    answers after it); loading c evicts b, and a's request is answered."""
    for name in ("a", "b", "c"):
        make_gguf_adapter(host.adapter_root, name)
    load(host, "a", str(host.adapter_root / "a"))
    load(host, "b", str(host.adapter_root / "b"))
    slow: list[httpx.Response] = []
    request = threading.Thread(target=lambda: slow.append(complete(host, "a", "sleep 2")))
    request.start()
    wait_for(lambda: host.pool._children["a"].in_flight == 1, what="a's request")
    text(complete(host, "b"))  # b is now more recent than a

    assert load(host, "c", str(host.adapter_root / "c")).status_code == 200

    assert served(host) == ["base-model", "a", "c"]
    request.join(timeout=10)
    assert text(slow[0]) == "from a + adapter.gguf"


def test_it_evicts_the_least_recently_used_idle_adapter(host):
    for name in ("a", "b", "c"):
        make_gguf_adapter(host.adapter_root, name)
    load(host, "a", str(host.adapter_root / "a"))
    load(host, "b", str(host.adapter_root / "b"))
    text(complete(host, "a"))

    assert load(host, "c", str(host.adapter_root / "c")).status_code == 200

    assert served(host) == ["base-model", "a", "c"]
    assert complete(host, "b").status_code == 404


def test_it_refuses_a_load_while_every_adapter_is_in_flight(tmp_path):
    with running_host(tmp_path, max_adapters=1) as host:
        make_gguf_adapter(host.adapter_root, "a")
        make_gguf_adapter(host.adapter_root, "b")
        load(host, "a", str(host.adapter_root / "a"))
        request = threading.Thread(target=lambda: complete(host, "a", "sleep 2"))
        request.start()
        wait_for(lambda: host.pool._children["a"].in_flight == 1, what="a's request")

        response = load(host, "b", str(host.adapter_root / "b"))

        request.join(timeout=10)
    assert response.status_code == 503
    assert "All 1 adapter slots are busy" in response.json()["error"]["message"]


def test_a_child_that_died_is_restarted_on_its_next_use(host):
    ft1 = make_gguf_adapter(host.adapter_root, "ft1")
    load(host, "ft1", str(ft1))
    first_pid = host.pool._children["ft1"].process.pid

    died = complete(host, "ft1", "die")
    next_use = complete(host, "ft1")

    assert died.status_code == 503 and "ft1.log" in died.json()["error"]["message"]
    message = next_use.json()["error"]["message"]
    assert next_use.status_code == 503
    assert "exited with code 3" in message and "being restarted" in message
    assert "ft1.log" in message
    # coevo's client retries 503s with backoff: the restart is invisible to a rollout.
    with PolicyClient(host.url, model="ft1", retries=6, backoff_s=0.3) as client:
        assert client.complete("hi", Sampling(max_tokens=4)).text == "from ft1 + adapter.gguf"
    assert host.pool._children["ft1"].process.pid != first_pid


def test_a_dead_base_is_not_listed_and_a_health_probe_restarts_it(host):
    """Beat's health check (GET /v1/models) sees the truth, and brings the base back even when
    no rollout asks for it."""
    base = host.pool._children["base-model"]
    dead_pid = base.process.pid
    base.process.kill()
    base.process.wait(timeout=10)

    assert served(host) == []  # and that probe started it again
    assert httpx.get(host.url.removesuffix("/v1") + "/health").status_code == 503

    wait_for(lambda: served(host) == ["base-model"], what="the base to be restarted")
    assert base.process.pid != dead_pid
    assert text(complete(host, "base-model")) == "from base-model"


def test_an_adapter_child_outlives_the_request_that_loaded_it(host):
    """PDEATHSIG follows the thread that forked the child: children are forked by the host's
    long-lived spawner thread, not by the request's thread, which ends with its connection."""
    ft1 = make_gguf_adapter(host.adapter_root, "ft1")
    load(host, "ft1", str(ft1))  # its own connection, closed after the answer
    time.sleep(1)

    assert alive(host.pool._children["ft1"].process.pid)
    assert text(complete(host, "ft1")) == "from ft1 + adapter.gguf"


def wait_serving(process: HostProcess, names: list[str]) -> None:
    def ready() -> bool:
        assert process.process.poll() is None, process.log()
        try:
            return served(process) == names
        except httpx.HTTPError:
            return False

    wait_for(ready, what=f"the host to serve {names}")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_the_host_stops_every_child_on_sigterm_or_sigint(tmp_path, signum):
    host = HostProcess(tmp_path)
    try:
        wait_serving(host, ["base-model"])
        make_gguf_adapter(host.adapter_root, "ft1")
        assert load(host, "ft1", str(host.adapter_root / "ft1")).status_code == 200
        children = host.children()
        assert len(children) == 2 and all(alive(pid) for pid in children)

        host.process.send_signal(signum)

        assert host.process.wait(timeout=30) == 0
        assert not any(alive(pid) for pid in children)
        log = host.log()
        assert "started child ft1" in log and "stopped child ft1" in log
        assert "stopped child base-model" in log
    finally:
        host.stop()


def test_children_die_with_a_host_that_is_killed(tmp_path):
    host = HostProcess(tmp_path)
    try:
        wait_serving(host, ["base-model"])
        make_gguf_adapter(host.adapter_root, "ft1")
        load(host, "ft1", str(host.adapter_root / "ft1"))
        children = host.children()

        host.process.kill()  # no chance to stop them: the kernel must (PDEATHSIG)

        host.process.wait(timeout=10)
        wait_for(lambda: not any(alive(pid) for pid in children), what="the children to die")
    finally:
        host.stop()


def test_a_host_whose_base_model_does_not_start_exits_with_the_reason(tmp_path):
    failing = [sys.executable, "-c", "import sys; print('no such model'); sys.exit(2)"]
    host = HostProcess(tmp_path, child_command=failing)
    try:
        code = host.process.wait(timeout=30)
    finally:
        host.stop()

    assert code == 1
    log = host.log()
    assert "the base model's server did not start" in log
    assert "exited with code 2" in log and "no such model" in log
