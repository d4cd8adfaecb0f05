"""The coevo llama.cpp host for real: llama_cpp.server children serving the shipped Gemma 3 270M
and a GGUF LoRA adapter loaded at run time."""

from __future__ import annotations

import subprocess

import httpx
import pytest

from coevo.policies.embedded import (
    DEFAULT_MODEL_ALIAS,
    base_model_gguf,
    llamacpp_host_command,
    wait_until_serving,
)
from coevo.training.gguf_adapter import adapter_gguf_write, base_gguf_layout
from tests.support.llamacpp_host import alive, child_pids
from tests.support.net import free_port
from tests.support.tiny_trainer import write_shaped_adapter

pytestmark = pytest.mark.llm


def test_it_serves_gemma_and_a_lora_adapter_loaded_at_run_time(tmp_path):
    model = base_model_gguf(DEFAULT_MODEL_ALIAS)
    adapter_root = tmp_path / "adapters"
    (adapter_root / "ft1").mkdir(parents=True)
    # A random LoRA on every block's q and v projections, large enough that greedy text
    # changes, converted by coevo's own converter (as a training run on llama.cpp does).
    layout = base_gguf_layout(path=model)
    shapes = {hf: layout.shapes[f"blk.0.{name}.weight"] for hf, name in
              (("q_proj", "attn_q"), ("v_proj", "attn_v"))}  # fmt: skip
    write_shaped_adapter(tmp_path / "peft", base=DEFAULT_MODEL_ALIAS, shapes=shapes,
                         layers=layout.block_count, a_scale=0.1, b_scale=0.1)  # fmt: skip
    adapter_gguf_write(
        peft_dir=tmp_path / "peft", base_gguf=model, out=adapter_root / "ft1" / "adapter.gguf"
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    command = llamacpp_host_command(
        model, port=port, adapter_root=adapter_root, log_dir=tmp_path / "models"
    )
    log_path = tmp_path / "host.log"
    with log_path.open("wb") as log:
        host = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until_serving(url, model=DEFAULT_MODEL_ALIAS, process=host)
        with httpx.Client(base_url=url, timeout=120) as client:

            def complete(model: str) -> str:
                reply = client.post(
                    "/completions",
                    json={"model": model, "prompt": "The capital of France is",
                          "max_tokens": 8, "temperature": 0.0},
                )  # fmt: skip
                assert reply.status_code == 200, reply.text
                assert reply.json()["model"] == model
                return reply.json()["choices"][0]["text"]

            base_text = complete(DEFAULT_MODEL_ALIAS)
            loaded = client.post(
                "/load_lora_adapter",
                json={"lora_name": "ft1", "lora_path": str(adapter_root / "ft1")},
            )
            assert loaded.status_code == 200, loaded.text
            models = {m["id"]: m for m in client.get("/models").json()["data"]}
            assert models["ft1"]["parent"] == DEFAULT_MODEL_ALIAS

            adapter_text = complete("ft1")

            assert base_text.strip() and adapter_text.strip()
            assert adapter_text != base_text  # the adapter's weights changed the answer
            assert complete(DEFAULT_MODEL_ALIAS) == base_text  # and only under its name
            children = child_pids(host.pid)
            unloaded = client.post("/unload_lora_adapter", json={"lora_name": "ft1"})
            assert unloaded.status_code == 200, unloaded.text
            assert [m["id"] for m in client.get("/models").json()["data"]] == [DEFAULT_MODEL_ALIAS]
        log = log_path.read_text()
        assert "started child ft1" in log and "stopped child ft1" in log
        assert len(children) == 2 and sum(alive(pid) for pid in children) == 1
    finally:
        host.terminate()
        host.wait(timeout=30)


def test_it_says_which_of_a_chat_request_gemma_could_not_honour(tmp_path):
    """The shipped Gemma GGUF has no chat template: llama-cpp-python renders its llama-2 format,
    which has no tools, so the tools a request offers never reach the model. The host answers
    and names them in ``coevo_degraded``; OpenAI's json_schema is answered (translated)."""
    model = base_model_gguf(DEFAULT_MODEL_ALIAS)
    (tmp_path / "adapters").mkdir()
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    command = llamacpp_host_command(
        model, port=port, adapter_root=tmp_path / "adapters", log_dir=tmp_path / "models"
    )
    with (tmp_path / "host.log").open("wb") as log:
        host = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    weather = {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    try:
        wait_until_serving(url, model=DEFAULT_MODEL_ALIAS, process=host)
        with httpx.Client(base_url=url, timeout=120) as client:
            offered = client.post(
                "/chat/completions",
                json={"messages": ask, "tools": [weather], "max_tokens": 8, "temperature": 0.0},
            )
            formatted = client.post(
                "/chat/completions",
                json={"messages": ask, "max_tokens": 24, "temperature": 0.0,
                      "response_format": {"type": "json_schema",
                                          "json_schema": {"name": "w", "schema": schema}}},
            )  # fmt: skip
    finally:
        host.terminate()
        host.wait(timeout=30)

    assert offered.status_code == 200, offered.text
    (degraded,) = offered.json()["coevo_degraded"]
    assert degraded["field"] == "tools"
    assert degraded["why"].startswith("tools were not passed to the model: its GGUF has no chat")
    assert not offered.json()["choices"][0]["message"].get("tool_calls")
    assert formatted.status_code == 200, formatted.text
    assert "coevo_degraded" not in formatted.json()
    assert formatted.json()["choices"][0]["message"]["content"].lstrip().startswith("{")
    assert "the model's chat template: none" in (tmp_path / "host.log").read_text()
