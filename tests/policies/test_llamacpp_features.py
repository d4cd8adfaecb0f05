"""What the coevo llama.cpp host honours of a request, decided from its model's chat template:
tools it cannot show the model are named in the reply's ``coevo_degraded``, a request it cannot
serve is refused naming the field, OpenAI's ``json_schema`` is translated to what
llama-cpp-python honours."""

from __future__ import annotations

import struct
from pathlib import Path

import httpx
import pytest

from coevo.policies.client import PolicyClient, ServerFlavor
from coevo.policies.llamacpp_children import Refused
from coevo.policies.llamacpp_features import chat_template_read, request_adapt
from tests.support.llamacpp_host import running_host

CHAT = "/v1/chat/completions"
TOOL = {"type": "function", "function": {"name": "look", "parameters": {"type": "object"}}}
GEMMA_LIKE = (
    "{{ bos_token }}{% for message in messages %}<start_of_turn>{{ message['role'] }}\n"
    "{{ message['content'] }}<end_of_turn>\n{% endfor %}<start_of_turn>model\n"
)
TOOL_AWARE = "{% if tools %}Tools: {{ tools | tojson }}\n{% endif %}" + GEMMA_LIKE


def gguf(path: Path, template: str | None) -> Path:
    """A GGUF v3 header as convert_hf_to_gguf writes one: the vocabulary (an array of strings)
    before the chat template, a scalar between."""

    def string(text: str) -> bytes:
        data = text.encode()
        return struct.pack("<Q", len(data)) + data

    kvs = [
        string("general.architecture") + struct.pack("<I", 8) + string("gemma3"),
        string("tokenizer.ggml.tokens")
        + struct.pack("<IIQ", 9, 8, 3)
        + b"".join(string(t) for t in ("<pad>", "tools", "▁hi")),
        string("gemma3.context_length") + struct.pack("<II", 4, 32768),
        string("tokenizer.ggml.scores") + struct.pack("<IIQ", 9, 6, 3) + b"\0" * 12,
    ]
    if template is not None:
        kvs.append(string("tokenizer.chat_template") + struct.pack("<I", 8) + string(template))
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs))
    return path


def adapt(body: dict, template: str | None = GEMMA_LIKE) -> tuple[list[dict], dict]:
    body = dict(body)
    return request_adapt(CHAT, body, template=template), body


def fields(degraded: list[dict]) -> list[str]:
    return [entry["field"] for entry in degraded]


def test_it_reads_the_chat_template_past_the_vocabulary(tmp_path):
    assert chat_template_read(gguf(tmp_path / "m.gguf", TOOL_AWARE)) == TOOL_AWARE


@pytest.mark.parametrize("content", [b"", b"GGUF\3\0\0\0", b"GGUF" + b"\0" * 28, b"GGML1234"])
def test_it_reads_no_template_from_a_file_without_one_or_a_broken_one(tmp_path, content):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(content)

    assert chat_template_read(gguf(tmp_path / "none.gguf", None)) is None
    assert chat_template_read(broken) is None


def test_it_says_tools_were_not_passed_when_the_template_has_no_place_for_them():
    degraded, _ = adapt({"messages": [], "tools": [TOOL]})

    assert fields(degraded) == ["tools"]
    assert degraded[0]["why"].startswith("tools were not passed to the model: its chat template")


def test_it_says_so_when_the_model_has_no_chat_template_at_all():
    degraded, _ = adapt({"messages": [], "tools": [TOOL]}, template=None)

    assert degraded[0]["why"].startswith("tools were not passed to the model: its GGUF has no")


def test_tools_a_template_renders_still_come_back_as_text():
    degraded, _ = adapt({"messages": [], "tools": [TOOL], "tool_choice": "auto"}, TOOL_AWARE)

    assert fields(degraded) == ["tools"]
    assert degraded[0]["why"].startswith("tool calls were not parsed back: the model saw")


def test_a_named_tool_choice_on_a_tool_aware_template_is_honoured():
    choice = {"type": "function", "function": {"name": "look"}}

    degraded, _ = adapt({"messages": [], "tools": [TOOL], "tool_choice": choice}, TOOL_AWARE)

    assert degraded == []


def test_a_named_tool_choice_is_forced_though_the_model_did_not_see_the_tools():
    choice = {"type": "function", "function": {"name": "look"}}

    degraded, _ = adapt({"messages": [], "tools": [TOOL], "tool_choice": choice})

    assert fields(degraded) == ["tools"]
    assert "the named tool_choice was honoured" in degraded[0]["why"]


def test_a_required_tool_choice_is_not_enforced():
    degraded, _ = adapt({"messages": [], "tools": [TOOL], "tool_choice": "required"}, TOOL_AWARE)

    assert fields(degraded) == ["tools", "tool_choice"]


@pytest.mark.parametrize(
    "body",
    [
        {"messages": []},
        {"messages": [], "tools": [TOOL], "tool_choice": "none"},
        {"messages": [], "tools": []},
        {"messages": [], "response_format": {"type": "json_object"}},
        {"messages": [], "temperature": 0.7, "top_p": 0.9, "seed": 3, "stop": ["x"], "n": 1},
    ],
)
def test_what_it_honours_is_not_named(body):
    assert adapt(body) == ([], body)


def test_more_than_one_choice_is_named_on_either_api():
    degraded = request_adapt("/v1/completions", {"prompt": "x", "n": 3}, template=GEMMA_LIKE)

    assert fields(degraded) == ["n"]
    assert "not n=3" in degraded[0]["why"]


def test_it_translates_openais_json_schema_to_what_llama_cpp_python_honours():
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    asked = {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}

    degraded, sent = adapt({"messages": [], "response_format": asked})

    assert degraded == []
    assert sent["response_format"] == {"type": "json_object", "schema": schema}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "x"}}},
         "tool_choice"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "r"}}},
         "response_format"),
        ({"response_format": {"type": "xml"}}, "response_format"),
    ],
)  # fmt: skip
def test_it_refuses_a_request_it_cannot_serve_naming_the_field(body, param):
    with pytest.raises(Refused) as refused:
        adapt({"messages": [], **body})

    assert (refused.value.status, refused.value.param) == (400, param)


@pytest.fixture
def host(tmp_path):
    with running_host(tmp_path, model=gguf(tmp_path / "base.gguf", GEMMA_LIKE)) as host:
        yield host


def test_the_host_answers_tools_it_cannot_pass_with_coevo_degraded(host):
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": [TOOL], "max_tokens": 4}

    reply = httpx.post(f"{host.url}/chat/completions", json=body, timeout=30)

    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"] == "from base-model"
    assert fields(reply.json()["coevo_degraded"]) == ["tools"]


def test_the_host_refuses_in_openais_format_naming_the_field(host):
    body = {"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "xml"}}

    reply = httpx.post(f"{host.url}/chat/completions", json=body, timeout=30)

    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "response_format"


def test_the_host_reports_its_context_window_to_coevos_client(host):
    with PolicyClient(host.url, model="base-model", retries=0) as client:
        info = client.server_info()

    assert (info.flavor, info.context_tokens) == (ServerFlavor.LLAMA_CPP_PYTHON, 512)
