"""OpenAI's Responses API at the model boundary, and Anthropic's count_tokens: the translation
both ways (no I/O), the routes over the boundary's socket, and sandboxed rollouts where a
program uses the unmodified ``openai`` SDK's ``client.responses``, with the scripted OpenAI
server as the policy behind the boundary."""

from __future__ import annotations

import json
import math
import secrets
import textwrap
from typing import Any

import pydantic
import pytest
from openai.types.responses import Response, ResponseStreamEvent

from tests.support.openai_server import ScriptedOpenAIServer, ScriptedPolicy
from tests.workers.test_boundary_anthropic import FakeRunner, _UnixConnection, chat_reply
from tests.workers.test_program_harness import program, rollout, steps
from workers import anthropic_messages, openai_responses
from workers.boundary import BoundaryRefusal, ModelBoundary
from workers.openai_requests import MAX_TOOLS, BadRequest, error_body
from workers.openai_responses import ResponseStore, UnknownResponse
from workers.outcomes import ErrorKind, RolloutOutcome

ADD_TOOL = {
    "type": "function",
    "name": "add",
    "description": "Add two numbers.",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
    },
}
CALLS = [
    {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}},
    {"id": "call_2", "type": "function", "function": {"name": "add", "arguments": "{}"}},
]


def parse(body: Any, kept: dict[str, list] | None = None) -> openai_responses.Request:
    return openai_responses.parse_request(body, history=(kept or {}).get)


# --- requests: Responses → chat ---------------------------------------------------------------


def test_it_turns_instructions_and_a_string_input_into_chat_messages():
    request = parse(
        {
            "model": "gpt-5-codex",
            "instructions": "Be brief.",
            "input": "is the sky blue?",
            "temperature": 0.5,
            "top_p": 0.9,
            "max_output_tokens": 64,
            "reasoning": {"effort": "high"},
            "include": ["reasoning.encrypted_content"],
            "store": False,
            "metadata": {"run": "1"},
            "frobnicate": 1,
        }
    )
    assert request.chat == {
        "model": "gpt-5-codex",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "is the sky blue?"},
        ],
        "temperature": 0.5,
        "top_p": 0.9,
        "max_tokens": 64,
    }
    # What no policy server can do is dropped, and said so (the trace records it).
    assert request.dropped == ["include", "reasoning", "frobnicate"]
    # The instructions are not part of the conversation a later response continues.
    assert request.conversation == [{"role": "user", "content": "is the sky blue?"}]
    assert (request.store, request.stream, request.echo["metadata"]) == (False, False, {"run": "1"})


def test_it_turns_function_calls_and_their_outputs_into_tool_calls_and_tool_messages():
    request = parse(
        {
            "input": [
                {"role": "developer", "content": "Use tools."},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "add"}]},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {
                    "type": "message",
                    "role": "assistant",
                    "id": "msg_1",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "Adding.", "annotations": []}],
                },
                {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "add",
                 "arguments": '{"a": 2}'},
                {"type": "function_call", "call_id": "call_2", "name": "add", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "2"},
                {"type": "function_call_output", "call_id": "call_2",
                 "output": [{"type": "input_text", "text": "0"}]},
                {"role": "user", "content": [
                    {"type": "input_text", "text": "and now?"},
                    {"type": "input_image", "image_url": "data:image/png;base64,AA==", "detail": "low"},
                ]},
            ]
        }
    )  # fmt: skip
    assert request.chat["messages"] == [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "add"},
        # The calls of one reply follow its text: one chat message, as the policy said it.
        {"role": "assistant", "content": "Adding.", "tool_calls": CALLS},
        {"role": "tool", "tool_call_id": "call_1", "content": "2"},
        {"role": "tool", "tool_call_id": "call_2", "content": "0"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "and now?"},
                {
                    "type": "image_url",
                    "image_url": {"url": "data:image/png;base64,AA==", "detail": "low"},
                },
            ],
        },
    ]


def test_a_function_call_without_text_before_it_is_an_assistant_message_without_content():
    request = parse(
        {"input": [{"type": "function_call", "call_id": "c", "name": "add", "arguments": "{}"}]}
    )
    assert request.chat["messages"] == [
        {"role": "assistant", "content": None, "tool_calls": [{**CALLS[1], "id": "c"}]}
    ]


@pytest.mark.parametrize(
    ("tool_choice", "expected"),
    [
        ("auto", "auto"),
        ("required", "required"),
        ("none", "none"),
        ({"type": "function", "name": "add"}, {"type": "function", "function": {"name": "add"}}),
    ],
)
def test_it_turns_flat_tools_and_tool_choice_into_function_tools(tool_choice, expected):
    request = parse(
        {
            "input": "add",
            "tools": [{**ADD_TOOL, "strict": False}],
            "tool_choice": tool_choice,
            "parallel_tool_calls": False,
            "text": {"format": {"type": "json_schema", "name": "sum", "schema": {}}},
        }
    )
    assert request.chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add two numbers.",
                "parameters": ADD_TOOL["parameters"],
                "strict": False,
            },
        }
    ]
    assert request.chat["tool_choice"] == expected
    assert request.chat["parallel_tool_calls"] is False
    assert request.chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "sum", "schema": {}},
    }
    assert request.echo["tool_choice"] == tool_choice


def test_previous_response_id_puts_the_kept_conversation_before_the_new_input():
    kept = {
        "resp_1": [
            {"role": "user", "content": "add"},
            {"role": "assistant", "content": None, "tool_calls": CALLS[:1]},
        ]
    }
    request = parse(
        {
            "instructions": "Be brief.",
            "previous_response_id": "resp_1",
            "input": [{"type": "function_call_output", "call_id": "call_1", "output": "2"}],
        },
        kept,
    )
    assert request.chat["messages"] == [
        {"role": "system", "content": "Be brief."},
        *kept["resp_1"],
        {"role": "tool", "tool_call_id": "call_1", "content": "2"},
    ]
    assert request.conversation == request.chat["messages"][1:]
    with pytest.raises(UnknownResponse) as raised:
        parse({"previous_response_id": "resp_2", "input": "x"}, kept)
    assert (raised.value.param, raised.value.code) == (
        "previous_response_id",
        "previous_response_not_found",
    )


@pytest.mark.parametrize(
    ("change", "param", "message"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0]", "type 'web_search'"),
        ({"tools": [{"type": "file_search", "vector_store_ids": []}]}, "tools[0]", "built-in"),
        ({"tools": [{"type": "computer_use_preview"}]}, "tools[0]", "function tools only"),
        ({"tools": [{**ADD_TOOL, "name": "a b"}]}, "tools[0]", "letters, digits"),
        ({"tools": [ADD_TOOL, ADD_TOOL]}, "tools[1]", "earlier tool"),
        ({"tools": [ADD_TOOL] * (MAX_TOOLS + 1)}, "tools", f"at most {MAX_TOOLS}"),
        ({"tools": [{**ADD_TOOL, "parameters": {"x": "y" * 70_000}}]}, "tools[0]", "at most"),
        ({"tools": [ADD_TOOL], "tool_choice": {"type": "function", "name": "sub"}}, "tool_choice",
         "not one of the tools"),
        ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice", "tool_choice must be"),
        ({"background": True}, "background", "background is not served"),
        ({"conversation": "conv_1"}, "conversation", "keeps no conversations"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt", "prompt templates"),
        ({"max_tool_calls": 3}, "max_tool_calls", "no bound on tool calls"),
        ({"max_output_tokens": 0}, "max_output_tokens", "positive integer"),
        ({"max_output_tokens": True}, "max_output_tokens", "positive integer"),
        ({"stream": "yes"}, "stream", "true or false"),
        ({"input": 3}, "input", "a string or a list"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]", "'item_reference'"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0]", ".role must be"),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
         "input[0].content[0]", "'input_file'"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
         "input[0].content[0]", "no file_id"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "add", "arguments": {}}]},
         "input[0]", "arguments must be a string"),
        ({"input": [{"type": "function_call_output", "call_id": "c",
                     "output": [{"type": "input_image", "image_url": "x"}]}]},
         "input[0]", "text only"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0]", "call_id"),
        ({"input": ["x"] * 10_001}, "input", "more than 10000"),
        ({"previous_response_id": "r" * 300}, "previous_response_id", "at most 256"),
        ({"metadata": {str(i): "v" for i in range(17)}}, "metadata", "at most 16"),
        ({"metadata": {"k": 1}}, "metadata", "pairs of strings"),
        ({"text": {"format": {"type": "grammar"}}}, "text.format", "text.format must be"),
        ({"text": {"format": {"type": "json_schema", "name": "s"}}}, "text.format", "schema"),
        ({"include": ["x"] * 40}, "include", "at most 32"),
        ({"truncation": "sometimes"}, "truncation", "'auto' or 'disabled'"),
        ({"instructions": 3}, "instructions", "instructions must be"),
        ({"model": ["gpt"]}, "model", "model must be"),
    ],
)  # fmt: skip
def test_it_refuses_what_it_cannot_translate_or_honour(change, param, message):
    with pytest.raises(BadRequest) as raised:
        parse({"input": "hi", **change})
    assert raised.value.param == param
    assert message in str(raised.value)


def test_the_ignored_keys_it_lists_are_bounded():
    request = parse({"input": "hi", **{f"{'k' * 100}{i:03}": 1 for i in range(500)}})
    assert len(request.dropped) == openai_responses.MAX_DROPPED
    assert {len(key) for key in request.dropped} == {64}


# --- replies: chat → Response ------------------------------------------------------------------


def reply_of(message: dict[str, Any], finish: str = "stop") -> tuple[dict, dict]:
    request = parse({"input": "add", "tools": [ADD_TOOL], "metadata": {"m": "1"}})
    clean = {**request.chat, "temperature": 1.0, "top_p": 1.0, "max_tokens": 1024}
    return openai_responses.response(
        chat_reply(message, finish), request, clean, response_id="resp_x"
    )


def test_it_turns_a_text_reply_into_a_response_the_sdk_validates():
    whole, said = reply_of({"role": "assistant", "content": "yes"})
    parsed = Response.model_validate(whole)  # strict: every required field, every type
    assert parsed.output_text == "yes"
    assert (parsed.id, parsed.status, parsed.model, parsed.incomplete_details) == (
        "resp_x",
        "completed",
        "base",
        None,
    )
    (item,) = whole["output"]
    assert item["type"] == "message" and item["id"].startswith("msg_")
    assert item["content"] == [{"type": "output_text", "text": "yes", "annotations": []}]
    assert whole["usage"] == {
        "input_tokens": 12,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 3,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 15,
    }
    assert (whole["temperature"], whole["max_output_tokens"], whole["metadata"]) == (
        1.0,
        1024,
        {"m": "1"},
    )
    assert whole["tools"][0]["name"] == "add" and whole["parallel_tool_calls"] is True
    assert said == {"role": "assistant", "content": "yes"}


def test_it_turns_tool_calls_into_function_call_items():
    whole, said = reply_of(
        {"role": "assistant", "content": "Adding.", "tool_calls": CALLS}, "tool_calls"
    )
    Response.model_validate(whole)
    message, first, second = whole["output"]
    assert message["content"][0]["text"] == "Adding."
    assert {k: first[k] for k in ("type", "call_id", "name", "arguments", "status")} == {
        "type": "function_call",
        "call_id": "call_1",
        "name": "add",
        "arguments": '{"a": 2}',
        "status": "completed",
    }
    assert first["id"].startswith("fc_") and second["call_id"] == "call_2"
    # The reply as the policy said it, for the conversation kept under the response's id.
    assert said == {"role": "assistant", "content": "Adding.", "tool_calls": CALLS}


def test_a_reply_cut_at_max_tokens_is_an_incomplete_response():
    whole, _ = reply_of({"role": "assistant", "content": "the sky is"}, "length")
    assert (whole["status"], whole["incomplete_details"]) == (
        "incomplete",
        {"reason": "max_output_tokens"},
    )
    assert whole["output"][0]["status"] == "incomplete"


def events_of(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for chunk in data.decode().split("\n\n"):
        if chunk:
            name, payload = chunk.split("\n")
            assert name.startswith("event: ") and payload.startswith("data: ")
            events.append((name[7:], json.loads(payload[6:])))
    return events


def test_a_streamed_response_is_the_whole_response_as_openais_events_in_order():
    whole, _ = reply_of({"role": "assistant", "content": "Adding.", "tool_calls": CALLS[:1]})
    events = events_of(b"".join(openai_responses.stream_events(whole)))
    assert [name for name, _ in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    adapter = pydantic.TypeAdapter(ResponseStreamEvent)
    for number, (name, payload) in enumerate(events):
        assert (payload["type"], payload["sequence_number"]) == (name, number)
        adapter.validate_python(payload)  # each event as the SDK's types have it
    assert events[0][1]["response"]["output"] == [] and events[0][1]["response"]["usage"] is None
    assert events[4][1]["delta"] == "Adding."
    assert events[9][1]["delta"] == '{"a": 2}' and events[9][1]["output_index"] == 1
    assert events[8][1]["item"]["arguments"] == ""
    assert events[-1][1]["response"] == whole


def test_a_streamed_incomplete_response_ends_with_response_incomplete():
    whole, _ = reply_of({"role": "assistant", "content": "the sky"}, "length")
    events = events_of(b"".join(openai_responses.stream_events(whole)))
    assert events[-1][0] == "response.incomplete"


def test_the_store_forgets_its_oldest_conversations_past_its_count_and_size():
    store = ResponseStore(max_responses=2, max_chars=200)
    for i in range(3):
        store.put(f"r{i}", [{"role": "user", "content": str(i)}])
    assert (store.get("r0"), store.get("r2")) == (None, [{"role": "user", "content": "2"}])
    store.put("big", [{"role": "user", "content": "x" * 150}])
    assert store.get("r1") is None and store.get("r2") is None and store.get("big")
    store.put("huge", [{"role": "user", "content": "x" * 300}])  # past the whole room: not kept
    assert store.get("huge") is None and store.get("big")


# --- count_tokens ------------------------------------------------------------------------------


def test_count_tokens_estimates_without_a_tokenizer_and_counts_with_one():
    body = {
        "model": "claude-x",
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "x" * 300}],
        "tools": [
            {"name": "add", "input_schema": {"type": "object"}, "description": "Add."},
        ],
    }
    estimated = anthropic_messages.count_tokens(body)["input_tokens"]
    # The text (the system prompt, the message, the tool as a chat tool's JSON) at 3 characters
    # a token, with each message's template markers: an estimate that errs high.
    tool = {"name": "add", "parameters": {"type": "object"}, "description": "Add."}
    text = "Be brief.\n" + "x" * 300 + "\n" + json.dumps([{"type": "function", "function": tool}])
    overheads = 2 * anthropic_messages.MESSAGE_OVERHEAD_TOKENS
    reply = anthropic_messages.REPLY_OVERHEAD_TOKENS
    assert estimated == math.ceil(len(text) / 3) + overheads + reply
    counted = anthropic_messages.count_tokens(body, tokenizer=lambda text: 7)
    assert counted == {"input_tokens": 7 + overheads + reply}
    # A tokenizer that cannot answer leaves the estimate.
    assert anthropic_messages.count_tokens(body, tokenizer=lambda text: None) == {
        "input_tokens": estimated
    }


# --- the routes, over the boundary's socket ------------------------------------------------------


def post(
    boundary: ModelBoundary, body: Any, *, path: str = "/v1/responses", key: str | None = None
) -> tuple[int, Any]:
    connection = _UnixConnection(str(boundary.socket_path))
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {
        "Authorization": f"Bearer {boundary.token if key is None else key}",
        "Content-Type": "application/json",
    }
    try:
        connection.request("POST", path, body=data, headers=headers)
        response = connection.getresponse()
        raw = response.read()
        is_json = response.getheader("Content-Type") == "application/json"
        return response.status, json.loads(raw) if is_json else raw
    finally:
        connection.close()


def test_the_route_asks_one_checked_chat_call_and_continues_it_by_id():
    runner = FakeRunner()
    with ModelBoundary(handler=runner, token=secrets.token_urlsafe(16)) as boundary:
        status, first = post(boundary, {"model": "gpt-x", "instructions": "Hi.", "input": "sky?"})
        assert status == 200, first
        status, second = post(
            boundary, {"input": "and grass?", "previous_response_id": first["id"]}
        )
        assert status == 200, second
        _, forgotten = post(boundary, {"input": "x", "store": False})
        status, refused = post(boundary, {"input": "y", "previous_response_id": forgotten["id"]})

    assert first["id"].startswith("resp_") and first["output"][0]["content"][0]["text"] == "yes"
    (api, body, dropped), (_, continued, _), _ = runner.calls
    assert api == "chat" and dropped == []
    # The chat API's checks applied: explicit sampling, the rollout's seed, no model name.
    assert (body["seed"], body["temperature"], body["max_tokens"], "model" in body) == (
        7,
        1.0,
        1000,
        False,
    )
    assert continued["messages"] == [
        {"role": "user", "content": "sky?"},
        {"role": "assistant", "content": "yes"},
        {"role": "user", "content": "and grass?"},
    ]
    assert second["previous_response_id"] == first["id"]
    # store: false keeps nothing to continue.
    assert status == 400
    assert refused["error"]["code"] == "previous_response_not_found"
    assert refused["error"]["param"] == "previous_response_id"


def test_a_response_id_of_another_rollout_is_unknown():
    with ModelBoundary(handler=FakeRunner(), token="k") as one:
        _, made = post(one, {"input": "sky?"})
    runner = FakeRunner()
    with ModelBoundary(handler=runner, token="k") as other:
        status, error = post(other, {"input": "x", "previous_response_id": made["id"]})
    assert status == 400 and error["error"]["code"] == "previous_response_not_found"
    assert runner.calls == []  # refused before any model saw it


def test_a_streamed_request_gets_the_responses_event_stream():
    with ModelBoundary(handler=FakeRunner(), token="k") as boundary:
        status, data = post(boundary, {"input": "sky?", "stream": True})
    assert status == 200
    events = events_of(data)
    assert events[0][0] == "response.created" and events[-1][0] == "response.completed"
    assert events[-1][1]["response"]["output"][0]["content"][0]["text"] == "yes"


@pytest.mark.parametrize(
    ("runner", "body", "key", "status", "code", "message"),
    [
        (
            FakeRunner(
                refusal=BoundaryRefusal(
                    429,
                    error_body(
                        "limit exceeded: more than max_model_calls = 1 model calls",
                        type="coevo_limit",
                        code="limit_exceeded",
                    ),
                )
            ),
            {"input": "hi"},
            None,
            429,
            "limit_exceeded",
            "max_model_calls = 1",
        ),
        (FakeRunner(), {"input": "hi"}, "sk-guess", 401, "invalid_api_key", "OPENAI_API_KEY"),
        (FakeRunner(), b"{not json", None, 400, None, "not valid JSON"),
        (FakeRunner(), b"[1]", None, 400, None, "JSON object"),
        (FakeRunner(), {"input": "hi", "temperature": 3}, None, 400, None, "temperature must"),
        (
            FakeRunner(),
            {"input": "hi", "tools": [{"type": "web_search_preview"}]},
            None,
            400,
            None,
            "built-in tools",
        ),
        (FakeRunner(), {"input": "hi", "background": True}, None, 400, None, "background"),
    ],
)
def test_errors_on_the_route_are_in_openais_shape(runner, body, key, status, code, message):
    with ModelBoundary(handler=runner, token="the-key") as boundary:
        got, error = post(boundary, body, key=key)
    assert got == status
    assert set(error["error"]) == {"message", "type", "param", "code"}
    assert error["error"]["code"] == code and message in error["error"]["message"]


class CountingRunner(FakeRunner):
    def token_count(self, text: str) -> int | None:
        return len(text.split())


def test_count_tokens_is_answered_not_a_404():
    body = {"model": "claude-x", "messages": [{"role": "user", "content": "one two three"}]}
    path = anthropic_messages.COUNT_TOKENS_PATH
    with ModelBoundary(handler=FakeRunner(), token="k") as boundary:
        estimated = post(boundary, body, path=path)
        refused = post(boundary, {"messages": []}, path=path)
    with ModelBoundary(handler=CountingRunner(), token="k") as boundary:
        counted = post(boundary, body, path=path)

    overhead = anthropic_messages.MESSAGE_OVERHEAD_TOKENS + anthropic_messages.REPLY_OVERHEAD_TOKENS
    assert estimated == (200, {"input_tokens": 5 + overhead})  # 13 characters, 3 a token
    assert counted == (200, {"input_tokens": 3 + overhead})  # the policy's tokenizer
    # Errors in Anthropic's shape, as on /v1/messages.
    assert refused[0] == 400 and refused[1]["error"]["type"] == "invalid_request_error"


# --- the unmodified openai SDK's client.responses in the sandbox -----------------------------------

SDK_HEAD = """
import json, os
import openai

task = json.load(open(os.environ["COEVO_TASK_FILE"]))
# OPENAI_BASE_URL and OPENAI_API_KEY come from the environment; no retries, so that a refusal
# is seen once.
client = openai.OpenAI(max_retries=0)
ADD = {"type": "function", "name": "add", "description": "Add two numbers.",
       "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                       "b": {"type": "number"}}}}
def answer(value):
    json.dump(value, open(os.environ["COEVO_ANSWER_FILE"], "w"))
"""


def sdk_program(tmp_path, body: str, *, limits: str = ""):
    source = SDK_HEAD + textwrap.dedent(body)
    return program(tmp_path, {"agent.py": source}, command='["python3", "agent.py"]', limits=limits)


def test_the_openai_sdk_gets_responses_and_round_trips_a_function_call(tmp_path):
    policy = ScriptedPolicy(
        rules=[("sky", "yes"), ("5", "the sum is 5")],
        tool_rules=[("add 2 and 3", [("add", {"a": 2, "b": 3})])],
    )
    harness = sdk_program(
        tmp_path,
        """
        plain = client.responses.create(model="gpt-5", instructions="Answer yes or no.",
                                        input=task["question"], max_output_tokens=40)
        first = client.responses.create(model="gpt-5", input="add 2 and 3", tools=[ADD])
        (call,) = [item for item in first.output if item.type == "function_call"]
        arguments = json.loads(call.arguments)
        # The whole conversation sent back (as the Agents SDK does with store off) ...
        whole = client.responses.create(model="gpt-5", tools=[ADD], input=[
            {"role": "user", "content": "add 2 and 3"},
            *[item.model_dump(exclude_none=True) for item in first.output],
            {"type": "function_call_output", "call_id": call.call_id,
             "output": str(arguments["a"] + arguments["b"])}])
        # ... or only the new items, after previous_response_id.
        chained = client.responses.create(model="gpt-5", tools=[ADD],
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "5"}])
        try:
            client.responses.create(model="gpt-5", input="x", previous_response_id="resp_nope")
            unknown = None
        except openai.BadRequestError as exc:
            unknown = [exc.status_code, exc.code, exc.param]
        try:
            client.responses.create(model="gpt-5", input="x", tools=[{"type": "web_search"}])
            builtin = None
        except openai.BadRequestError as exc:
            builtin = [exc.status_code, exc.param]
        answer({"plain": [plain.output_text, plain.status, plain.model, plain.usage.input_tokens,
                          plain.usage.output_tokens, plain.usage.total_tokens],
                "first": [call.name, arguments, call.call_id.startswith("call_"),
                          call.id.startswith("fc_"), first.output_text],
                "whole": whole.output_text, "chained": [chained.output_text,
                                                        chained.previous_response_id == first.id],
                "unknown": unknown, "builtin": builtin})
        """,
    )
    with ScriptedOpenAIServer(policy) as server:
        result = rollout(harness, server.url, expected="")

    calls = sorted(steps(result, "model_call"), key=lambda c: c["call"])
    plain = calls[0]
    assert result.answer == {
        "plain": ["yes", "completed", "base", plain["usage"]["prompt_tokens"], 1,
                  plain["usage"]["prompt_tokens"] + 1],
        "first": ["add", {"a": 2, "b": 3}, True, True, ""],
        "whole": "the sum is 5",
        "chained": ["the sum is 5", True],
        "unknown": [400, "previous_response_not_found", "previous_response_id"],
        "builtin": [400, "tools[0]"],
    }, result.detail  # fmt: skip
    assert len(calls) == 4 and result.model_calls == 4
    assert plain["api"] == "chat" and plain["via"] == "boundary"
    assert all(call["spoken"] == "responses" for call in calls)  # the API the harness used
    assert plain["messages"] == [
        {"role": "system", "content": "Answer yes or no."},
        {"role": "user", "content": "is the sky blue?"},
    ]
    assert plain["sampling"]["max_tokens"] == 40
    first, whole, chained = calls[1:]
    assert first["tools"][0]["function"]["name"] == "add"
    assert first["tool_calls"][0]["name"] == "add"
    # Both ways of going on continue the call that asked for the tool, in its session.
    for later in (whole, chained):
        assert (later["parent"], later["relation"], later["session"]) == (1, "continues", 1)
        assert later["messages"][-1]["role"] == "tool"
        assert later["messages"][-2]["tool_calls"][0]["id"] == first["tool_calls"][0]["id"]
    # The refused requests never reached the policy.
    assert len(server.policy.requests) == 4


def test_the_openai_sdk_streams_responses_with_text_and_function_calls(tmp_path):
    policy = ScriptedPolicy(
        rules=[("sky", "yes")], tool_rules=[("add 2 and 3", [("add", {"a": 2, "b": 3})])]
    )
    harness = sdk_program(
        tmp_path,
        """
        events = client.responses.create(model="gpt-5", input=task["question"], stream=True)
        kinds, text = [], ""
        for event in events:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                text += event.delta
            if event.type == "response.completed":
                completed = event.response
        with client.responses.stream(model="gpt-5", input="add 2 and 3", tools=[ADD]) as stream:
            deltas = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
            final = stream.get_final_response()
        (call,) = final.output
        answer({"kinds": kinds, "text": text, "completed": [completed.output_text,
                completed.status, completed.usage.output_tokens],
                "call": [call.type, call.name, json.loads(call.arguments)], "deltas": deltas})
        """,
    )
    with ScriptedOpenAIServer(policy) as server:
        result = rollout(harness, server.url, expected="")

    assert result.answer == {
        "kinds": [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ],
        "text": "yes",
        "completed": ["yes", "completed", 1],
        "call": ["function_call", "add", {"a": 2, "b": 3}],
        "deltas": ['{"a": 2, "b": 3}'],
    }, result.detail
    assert result.model_calls == 2


def test_a_response_past_max_model_calls_ends_the_rollout_as_a_limit(tmp_path):
    harness = sdk_program(
        tmp_path,
        """
        for _ in range(3):
            client.responses.create(model="gpt-5", input=task["question"])
        answer("yes")
        """,
        limits="max_model_calls = 1",
    )
    with ScriptedOpenAIServer(ScriptedPolicy(rules=[("sky", "yes")])) as server:
        result = rollout(harness, server.url)

    assert (result.outcome, result.error_kind) == (RolloutOutcome.HARNESS_ERROR, ErrorKind.LIMIT)
    assert "max_model_calls = 1" in result.detail
    assert result.model_calls == 1 and len(server.policy.requests) == 1


def test_a_response_past_max_tokens_ends_the_rollout_as_a_limit(tmp_path):
    harness = sdk_program(
        tmp_path,
        """
        try:
            for _ in range(5):
                client.responses.create(model="gpt-5", input=task["question"] + " " * 400)
        except openai.RateLimitError as exc:
            answer(exc.body)
        """,
        limits="max_tokens = 30",
    )
    with ScriptedOpenAIServer(ScriptedPolicy(rules=[("sky", "yes")])) as server:
        result = rollout(harness, server.url, expected="")

    assert (result.outcome, result.error_kind) == (RolloutOutcome.HARNESS_ERROR, ErrorKind.LIMIT)
    assert "max_tokens = 30" in result.detail


def test_the_anthropic_sdk_counts_tokens_in_the_sandbox(tmp_path):
    source = """
    import json, os
    import anthropic

    client = anthropic.Anthropic(max_retries=0)
    counted = client.messages.count_tokens(
        model="claude-x", messages=[{"role": "user", "content": "is the sky blue?"}])
    json.dump(counted.input_tokens, open(os.environ["COEVO_ANSWER_FILE"], "w"))
    """
    harness = program(tmp_path, {"agent.py": source}, command='["python3", "agent.py"]')
    with ScriptedOpenAIServer(ScriptedPolicy()) as server:
        result = rollout(harness, server.url, expected="")

    overhead = anthropic_messages.MESSAGE_OVERHEAD_TOKENS + anthropic_messages.REPLY_OVERHEAD_TOKENS
    assert result.answer == 6 + overhead, result.detail  # 16 characters, 3 a token
    assert result.model_calls == 0 and server.policy.requests == []


def test_a_program_past_its_wall_time_while_calling_responses_ends_as_a_limit(tmp_path):
    harness = sdk_program(
        tmp_path,
        """
        import time
        while True:
            client.responses.create(model="gpt-5", input=task["question"])
            time.sleep(1)  # the wall time ends it, never the 16 calls the manifest allows
        """,
        # Long enough for the SDK's import on a loaded machine to leave calls to make.
        limits="wall_time_s = 10",
    )
    with ScriptedOpenAIServer(ScriptedPolicy(rules=[("sky", "yes")])) as server:
        result = rollout(harness, server.url)

    assert (result.outcome, result.error_kind) == (RolloutOutcome.HARNESS_ERROR, ErrorKind.LIMIT)
    assert "wall time of 10s" in result.detail
    assert result.model_calls >= 1
