"""Anthropic's Messages API at the model boundary: the translation both ways (no I/O), the
route over the boundary's socket, and sandboxed rollouts where a program uses the unmodified
``anthropic`` SDK, with the scripted OpenAI server as the policy behind the boundary."""

from __future__ import annotations

import http.client
import json
import re
import secrets
import socket
import textwrap
from typing import Any

import pytest

from tests.support.openai_server import ScriptedOpenAIServer, ScriptedPolicy
from tests.workers.test_program_harness import program, rollout, steps
from workers import anthropic_messages, openai_requests
from workers.boundary import BoundaryRefusal, ModelBoundary
from workers.openai_requests import BadRequest, error_body
from workers.outcomes import ErrorKind, RolloutOutcome
from workers.program import _CallTree

ADD_TOOL = {
    "name": "add",
    "description": "Add two numbers.",
    "input_schema": {
        "type": "object",
        "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
    },
}


def chat_reply(message: dict[str, Any], finish: str = "stop", **choice: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "model": "base",
        "choices": [{"index": 0, "message": message, "finish_reason": finish, **choice}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
    }


# --- requests: Messages → chat ----------------------------------------------------------------


def test_it_turns_a_text_conversation_with_a_system_prompt_into_chat_messages():
    chat, dropped = anthropic_messages.chat_request(
        {
            "model": "claude-sonnet-4-5",
            "max_tokens": 64,
            "system": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
                {"role": "user", "content": [{"type": "text", "text": "is the sky blue?"}]},
            ],
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 40,
            "stop_sequences": ["\n\n"],
            "metadata": {"user_id": "u1"},
            "stream": False,
        }
    )
    assert chat == {
        "model": "claude-sonnet-4-5",
        "max_tokens": 64,
        "temperature": 0.5,
        "top_p": 0.9,
        "stop": ["\n\n"],
        "messages": [
            {"role": "system", "content": "Be brief.\n\nBe kind."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "is the sky blue?"},
        ],
    }
    # What has no chat counterpart is dropped, and said so (the trace records it).
    assert dropped == ["metadata", "top_k"]


def test_it_turns_tool_use_and_tool_result_blocks_into_tool_calls_and_tool_messages():
    chat, _ = anthropic_messages.chat_request(
        {
            "max_tokens": 64,
            "messages": [
                {"role": "user", "content": "add 2 and 3, then 4 and 5"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "two calls", "signature": "s"},
                        {"type": "text", "text": "Adding."},
                        {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 2}},
                        {"type": "tool_use", "id": "toolu_2", "name": "add", "input": {}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "5"},
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_2",
                            "content": [{"type": "text", "text": "9"}],
                            "is_error": False,
                        },
                        {"type": "text", "text": "and now?"},
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
                        },
                    ],
                },
            ],
        }
    )
    assert chat["messages"][1:] == [
        {
            "role": "assistant",
            "content": "Adding.",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 2}'},
                },
                {
                    "id": "toolu_2",
                    "type": "function",
                    "function": {"name": "add", "arguments": "{}"},
                },
            ],
        },
        # Tool results first (a chat API wants them right after the call), then the user's own.
        {"role": "tool", "tool_call_id": "toolu_1", "content": "5"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "9"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "and now?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
            ],
        },
    ]


def test_an_assistant_turn_of_tool_calls_only_has_no_content():
    chat, _ = anthropic_messages.chat_request(
        {
            "max_tokens": 8,
            "messages": [
                {"role": "user", "content": "add"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t", "name": "add", "input": {"a": 1}}],
                },
            ],
        }
    )
    assert chat["messages"][1]["content"] is None
    assert chat["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'


@pytest.mark.parametrize(
    ("tool_choice", "expected"),
    [
        ({"type": "auto"}, {"tool_choice": "auto"}),
        ({"type": "any"}, {"tool_choice": "required"}),
        ({"type": "none"}, {"tool_choice": "none"}),
        (
            {"type": "tool", "name": "add", "disable_parallel_tool_use": True},
            {
                "tool_choice": {"type": "function", "function": {"name": "add"}},
                "parallel_tool_calls": False,
            },
        ),
    ],
)
def test_it_turns_tools_and_tool_choice_into_function_tools(tool_choice, expected):
    chat, _ = anthropic_messages.chat_request(
        {
            "max_tokens": 8,
            "messages": [{"role": "user", "content": "add"}],
            "tools": [ADD_TOOL],
            "tool_choice": tool_choice,
        }
    )
    assert chat["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add two numbers.",
                "parameters": ADD_TOOL["input_schema"],
            },
        }
    ]
    assert {k: chat[k] for k in expected} == expected


@pytest.mark.parametrize(
    ("change", "param", "message"),
    [
        ({"max_tokens": None}, "max_tokens", "max_tokens is required"),
        ({"temperature": 1.5}, "temperature", "from 0 to 1"),
        ({"messages": []}, "messages", "non-empty list"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0]", "'user' or"),
        (
            {"tools": [{"type": "bash_20250124", "name": "bash"}]},
            "tools[0]",
            "built-in tool 'bash_20250124'",
        ),
        ({"tools": [{"name": "add"}]}, "tools[0]", "input_schema"),
        ({"tool_choice": {"type": "sometimes"}}, "tool_choice", "tool_choice must be"),
        ({"system": 3}, "system", "system must be"),
        (
            {"messages": [{"role": "assistant", "content": [{"type": "tool_use", "name": "x"}]}]},
            "messages[0].content[0]",
            "needs an id",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            "messages[0].content[0]",
            "type 'document' are not served",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "t",
                                "content": [{"type": "image", "source": {}}],
                            }
                        ],
                    }
                ]
            },
            "messages[0].content[0]",
            "text only",
        ),
    ],
)
def test_it_refuses_what_it_cannot_translate(change, param, message):
    body = {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], **change}
    with pytest.raises(BadRequest) as raised:
        anthropic_messages.chat_request(body)
    assert raised.value.param == param
    assert message in str(raised.value)


EPHEMERAL = {"type": "ephemeral"}


def test_it_keeps_each_cache_control_marker_on_the_chat_piece_its_block_became():
    """Claude Code marks its system prompt, its tools and its last turn for Anthropic's prompt
    cache: each marker rides where OpenAI-compatible gateways carry one (workers/
    chat_extensions.py), for an anthropic endpoint to put back."""
    hour = {"type": "ephemeral", "ttl": "1h"}
    chat, dropped = anthropic_messages.chat_request(
        {
            "max_tokens": 64,
            "system": [
                {"type": "text", "text": "You are Claude Code.", "cache_control": hour},
                {"type": "text", "text": "cwd: /app"},
            ],
            "tools": [{**ADD_TOOL, "cache_control": EPHEMERAL}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "add 2 and 3"}]},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "text", "text": "adding", "cache_control": EPHEMERAL},
                        {"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 2}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [{"type": "text", "text": "5"}],
                            "cache_control": EPHEMERAL,
                        },
                        {"type": "text", "text": "and now?"},
                    ],
                },
            ],
        }
    )
    assert chat["messages"] == [
        {
            "role": "system",
            "content": [
                {"type": "text", "text": "You are Claude Code.", "cache_control": hour},
                {"type": "text", "text": "cwd: /app"},
            ],
        },
        {"role": "user", "content": "add 2 and 3"},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "adding", "cache_control": EPHEMERAL}],
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 2}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "5", "cache_control": EPHEMERAL},
        {"role": "user", "content": "and now?"},
    ]
    assert chat["tools"][0]["cache_control"] == EPHEMERAL
    assert dropped == []


def test_a_lone_marked_text_block_stays_a_part_and_a_lifted_system_message_keeps_its_marker():
    chat, _ = anthropic_messages.chat_request(
        {
            "max_tokens": 8,
            "system": "You are Claude Code.",
            "messages": [
                {"role": "system", "content": [{"type": "text", "text": "cwd: /app", "cache_control": EPHEMERAL}]},
                {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": EPHEMERAL}]},
            ],
        }
    )  # fmt: skip
    assert chat["messages"] == [
        {
            "role": "system",
            "content": [
                {"type": "text", "text": "You are Claude Code."},
                {"type": "text", "text": "cwd: /app", "cache_control": EPHEMERAL},
            ],
        },
        {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": EPHEMERAL}]},
    ]


def test_a_tool_results_error_flag_rides_on_its_tool_message():
    chat, _ = anthropic_messages.chat_request(
        {
            "max_tokens": 8,
            "messages": [
                {"role": "user", "content": "add"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "add", "input": {}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "no a", "is_error": True},
                ]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t2", "name": "add", "input": {}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t2", "content": "5", "is_error": False},
                ]},
            ],
        }
    )  # fmt: skip
    tool_messages = [m for m in chat["messages"] if m["role"] == "tool"]
    assert tool_messages == [
        {"role": "tool", "tool_call_id": "t1", "content": "no a", "is_error": True},
        {"role": "tool", "tool_call_id": "t2", "content": "5"},
    ]


def marked_turns(count: int) -> list[dict[str, Any]]:
    return [
        {
            "role": role,
            "content": [{"type": "text", "text": f"turn {i}", "cache_control": EPHEMERAL}],
        }
        for i, role in zip(range(count), ["user", "assistant"] * count, strict=False)
    ]


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        ({"type": "persistent"}, "messages[0].content[0].cache_control must be"),
        ({"type": "ephemeral", "ttl": "2h"}, "optional 'ttl' of '5m' or '1h'"),
        ({"type": "ephemeral", "scope": "org"}, "cache_control must be"),
        ("ephemeral", "cache_control must be"),
    ],
)
def test_it_refuses_a_marker_anthropic_would_refuse(marker, message):
    turn = {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": marker}]}
    with pytest.raises(BadRequest, match=re.escape(message)):
        anthropic_messages.chat_request({"max_tokens": 8, "messages": [turn]})


def test_it_refuses_a_fifth_cache_breakpoint_in_anthropics_words():
    """Anthropic refuses more than four breakpoints; so does the boundary, before any model
    is asked, whatever serves the policy: the harness is told what Anthropic would tell it."""
    system = [{"type": "text", "text": "sys", "cache_control": EPHEMERAL}]
    anthropic_messages.chat_request(
        {"max_tokens": 8, "system": system, "messages": marked_turns(3)}
    )

    with pytest.raises(BadRequest) as raised:
        anthropic_messages.chat_request(
            {"max_tokens": 8, "system": system, "messages": marked_turns(4)}
        )
    assert str(raised.value) == "A maximum of 4 blocks with cache_control may be provided. Found 5."
    assert raised.value.param == "cache_control"


@pytest.mark.parametrize("flag", ["yes", 1])
def test_it_refuses_an_error_flag_that_is_not_a_boolean(flag):
    body = {
        "max_tokens": 8,
        "messages": [
            {"role": "user", "content": "add"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "add"}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "is_error": flag}]},
        ],
    }  # fmt: skip
    with pytest.raises(BadRequest, match=r"messages\[2\]\.content\[0\]\.is_error must be true"):
        anthropic_messages.chat_request(body)


def test_count_tokens_does_not_count_a_tools_marker():
    body = {"messages": [{"role": "user", "content": "hi"}], "tools": [ADD_TOOL]}
    marked = {**body, "tools": [{**ADD_TOOL, "cache_control": EPHEMERAL}]}
    assert anthropic_messages.count_tokens(marked) == anthropic_messages.count_tokens(body)


# --- replies: chat → Message ------------------------------------------------------------------


def test_it_turns_a_text_reply_into_a_message():
    message = anthropic_messages.message(chat_reply({"role": "assistant", "content": "yes"}))
    assert message == {
        "id": "chatcmpl-1",
        "type": "message",
        "role": "assistant",
        "model": "base",
        "content": [{"type": "text", "text": "yes"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 12, "output_tokens": 3},
    }


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        # An anthropic endpoint's reply, its cache counts kept (coevo/policies/anthropic_api.py).
        (
            {
                "prompt_tokens": 100,
                "cache_read_input_tokens": 60,
                "cache_creation_input_tokens": 30,
            },
            {"input_tokens": 10, "cache_creation_input_tokens": 30, "cache_read_input_tokens": 60},
        ),
        # OpenAI's (or vLLM's) cached tokens.
        (
            {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 64}},
            {"input_tokens": 36, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 64},
        ),
    ],
)
def test_what_the_prompt_cache_served_is_reported_as_anthropic_reports_it(usage, expected):
    reply = chat_reply({"role": "assistant", "content": "yes"})
    reply["usage"] = {**usage, "completion_tokens": 3}
    assert anthropic_messages.message(reply)["usage"] == {**expected, "output_tokens": 3}
    start = next(anthropic_messages.stream_events(anthropic_messages.message(reply)))
    assert (
        b'"cache_read_input_tokens": ' + str(expected["cache_read_input_tokens"]).encode() in start
    )


def test_it_turns_tool_calls_into_tool_use_blocks():
    calls = [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}},
        {"id": "call_2", "type": "function", "function": {"name": "add", "arguments": "{oops"}},
    ]
    message = anthropic_messages.message(
        chat_reply(
            {"role": "assistant", "content": "Let me add.", "tool_calls": calls}, "tool_calls"
        )
    )
    assert message["content"] == [
        {"type": "text", "text": "Let me add."},
        {"type": "tool_use", "id": "call_1", "name": "add", "input": {"a": 2}},
        # Arguments that are not a JSON object reach the program whole, not silently emptied.
        {"type": "tool_use", "id": "call_2", "name": "add", "input": {"raw_arguments": "{oops"}},
    ]
    assert message["stop_reason"] == "tool_use"


@pytest.mark.parametrize(
    ("finish", "extra", "stop_reason", "stop_sequence"),
    [
        ("stop", {}, "end_turn", None),
        ("length", {}, "max_tokens", None),
        ("tool_calls", {}, "tool_use", None),
        ("content_filter", {}, "refusal", None),
        # vLLM names the stop string that ended the choice.
        ("stop", {"stop_reason": "END"}, "stop_sequence", "END"),
        # A stop reason that is not one of the request's stop sequences (an EOS token id).
        ("stop", {"stop_reason": 106}, "end_turn", None),
    ],
)
def test_it_maps_finish_reasons_to_stop_reasons(finish, extra, stop_reason, stop_sequence):
    reply = chat_reply({"role": "assistant", "content": "ok"}, finish, **extra)
    message = anthropic_messages.message(reply, stop_sequences=["END"])
    assert (message["stop_reason"], message["stop_sequence"]) == (stop_reason, stop_sequence)


def parse_events(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for chunk in data.decode().split("\n\n"):
        if chunk:
            name, payload = chunk.split("\n")
            assert name.startswith("event: ") and payload.startswith("data: ")
            events.append((name[7:], json.loads(payload[6:])))
    return events


def test_a_streamed_message_is_the_whole_message_as_anthropics_events_in_order():
    calls = [{"id": "call_1", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]
    whole = anthropic_messages.message(
        chat_reply({"role": "assistant", "content": "Adding.", "tool_calls": calls}, "tool_calls")
    )
    events = parse_events(b"".join(anthropic_messages.stream_events(whole)))

    assert [name for name, _ in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert all(payload["type"] == name for name, payload in events)
    start = events[0][1]["message"]
    assert (start["content"], start["stop_reason"], start["usage"]) == (
        [],
        None,
        {"input_tokens": 12, "output_tokens": 0},
    )
    assert events[1][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    assert events[2][1]["delta"] == {"type": "text_delta", "text": "Adding."}
    assert events[4][1]["content_block"] == {
        "type": "tool_use",
        "id": "call_1",
        "name": "add",
        "input": {},
    }
    assert events[5][1] == {
        "type": "content_block_delta",
        "index": 1,
        "delta": {"type": "input_json_delta", "partial_json": '{"a": 2, "b": 3}'},
    }
    assert events[7][1] == {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use", "stop_sequence": None},
        "usage": {"output_tokens": 3},
    }


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (404, "not_found_error"),
        (409, "invalid_request_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (503, "api_error"),
    ],
)
def test_errors_take_anthropics_shape(status, kind):
    assert anthropic_messages.error_of(status, error_body("it went wrong")) == {
        "type": "error",
        "error": {"type": kind, "message": "it went wrong"},
    }


def test_a_tool_result_continues_its_call_in_the_tree_whatever_the_servers_json_spacing():
    # The SDK parses a tool call's arguments into tool_use input and sends them back in its
    # own spelling; the call tree must still see the same conversation.
    tree = _CallTree()
    ask = [{"role": "user", "content": "add 2 and 3"}]
    calls = [{"id": "call_1", "function": {"name": "add", "arguments": '{"b":3,"a":2}'}}]
    asked = chat_reply({"role": "assistant", "content": None, "tool_calls": calls}, "tool_calls")
    tree.place(0, "chat", {"messages": ask}, asked)
    use = anthropic_messages.message(asked)["content"]
    result = [{"type": "tool_result", "tool_use_id": "call_1", "content": "5"}]
    chat, _ = anthropic_messages.chat_request(
        {
            "max_tokens": 8,
            "messages": [
                *ask,
                {"role": "assistant", "content": use},
                {"role": "user", "content": result},
            ],
        }
    )
    assert chat["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"b": 3, "a": 2}'
    place = tree.place(1, "chat", chat, chat_reply({"role": "assistant", "content": "5"}))
    assert (place["parent"], place["relation"]) == (0, "continues")


# --- the route, over the boundary's socket ----------------------------------------------------


class FakeRunner:
    """A BoundaryHandler that answers with ``reply`` (or raises ``refusal``) and keeps what it
    was asked."""

    model_name = "base"

    def __init__(self, reply: dict[str, Any] | None = None, refusal: Exception | None = None):
        self.reply = reply or chat_reply({"role": "assistant", "content": "yes"})
        self.refusal = refusal
        self.calls: list[tuple[str, dict[str, Any], list[str]]] = []

    def check_request(self, api: str, body: Any) -> tuple[dict[str, Any], list[str]]:
        return openai_requests.check_request(api, body, seed=7, max_tokens_left=1000)

    def model_call(
        self, api: str, body: dict[str, Any], *, dropped: list[str], spoken: str | None = None
    ) -> dict[str, Any]:
        self.calls.append((api, body, dropped))
        if self.refusal is not None:
            raise self.refusal
        return self.reply


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("boundary", timeout=10)
        self.socket_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.socket_path)


def post(boundary: ModelBoundary, body: Any, *, key: str | None = None) -> tuple[int, bytes]:
    connection = _UnixConnection(str(boundary.socket_path))
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {
        "x-api-key": boundary.token if key is None else key,
        "anthropic-version": "2023-06-01",
        "Content-Type": "application/json",
    }
    try:
        connection.request("POST", "/v1/messages", body=data, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


HELLO = {"model": "claude-x", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}


def test_the_route_asks_the_runner_one_checked_chat_call():
    runner = FakeRunner()
    with ModelBoundary(handler=runner, token=secrets.token_urlsafe(16)) as boundary:
        status, data = post(boundary, {**HELLO, "system": "Be brief.", "top_k": 5})

    assert status == 200
    assert json.loads(data)["content"] == [{"type": "text", "text": "yes"}]
    ((api, body, dropped),) = runner.calls
    assert api == "chat" and dropped == ["top_k"]
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    # The chat API's checks applied: explicit sampling, the rollout's seed, no model name.
    assert (body["seed"], body["temperature"], body["max_tokens"]) == (7, 1.0, 16)
    assert "model" not in body


def test_a_streamed_request_gets_anthropics_event_stream():
    with ModelBoundary(handler=FakeRunner(), token="k") as boundary:
        status, data = post(boundary, {**HELLO, "stream": True})
    assert status == 200
    events = parse_events(data)
    assert [name for name, _ in events][0] == "message_start"
    assert [name for name, _ in events][-2:] == ["message_delta", "message_stop"]
    assert events[2][1]["delta"]["text"] == "yes"


@pytest.mark.parametrize(
    ("runner", "body", "key", "status", "kind", "message"),
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
            HELLO,
            None,
            429,
            "rate_limit_error",
            "max_model_calls = 1",
        ),
        (FakeRunner(), HELLO, "sk-guess", 401, "authentication_error", "ANTHROPIC_API_KEY"),
        (FakeRunner(), b"{not json", None, 400, "invalid_request_error", "not valid JSON"),
        (
            FakeRunner(),
            {**HELLO, "max_tokens": None},
            None,
            400,
            "invalid_request_error",
            "max_tokens is required",
        ),
        (
            FakeRunner(),
            {**HELLO, "messages": marked_turns(5)},
            None,
            400,
            "invalid_request_error",
            "A maximum of 4 blocks with cache_control may be provided. Found 5.",
        ),
    ],
)
def test_errors_on_the_route_are_in_anthropics_shape(runner, body, key, status, kind, message):
    with ModelBoundary(handler=runner, token="the-key") as boundary:
        got, data = post(boundary, body, key=key)
    error = json.loads(data)
    assert got == status
    assert error["type"] == "error" and error["error"]["type"] == kind
    assert message in error["error"]["message"]


# --- the unmodified anthropic SDK in the sandbox ----------------------------------------------

SDK_HEAD = """
import json, os
import anthropic

task = json.load(open(os.environ["COEVO_TASK_FILE"]))
# ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY come from the environment; no retries, so that a
# refusal is seen once.
client = anthropic.Anthropic(max_retries=0)
def answer(value):
    json.dump(value, open(os.environ["COEVO_ANSWER_FILE"], "w"))
"""


def sdk_program(tmp_path, body: str, *, limits: str = ""):
    source = SDK_HEAD + textwrap.dedent(body)
    return program(tmp_path, {"agent.py": source}, command='["python3", "agent.py"]', limits=limits)


def test_the_unmodified_anthropic_sdk_gets_a_message(tmp_path):
    harness = sdk_program(
        tmp_path,
        """
        reply = client.messages.create(
            model="claude-sonnet-4-5", max_tokens=50, system="Answer yes or no.",
            messages=[{"role": "user", "content": task["question"]}])
        answer([reply.content[0].text, reply.stop_reason, reply.model, reply.usage.input_tokens,
                reply.usage.output_tokens, os.environ["ANTHROPIC_BASE_URL"].count("/v1")])
        """,
    )
    with ScriptedOpenAIServer(ScriptedPolicy(rules=[("sky", "yes")])) as server:
        result = rollout(harness, server.url, expected="")

    assert isinstance(result.answer, list), result.detail
    assert result.answer[:3] == ["yes", "end_turn", "base"]
    (call,) = steps(result, "model_call")
    assert result.answer[3:] == [call["usage"]["prompt_tokens"], 1, 0]
    assert call["api"] == "chat" and call["via"] == "boundary" and call["spoken"] == "messages"
    assert call["messages"] == [
        {"role": "system", "content": "Answer yes or no."},
        {"role": "user", "content": "is the sky blue?"},
    ]
    (sent,) = server.policy.requests
    assert sent["model"] == "scripted" and sent["max_tokens"] == 50 and sent["seed"] == 11


def test_the_anthropic_sdk_round_trips_a_tool_use(tmp_path):
    policy = ScriptedPolicy(
        rules=[("5", "the sum is 5")],
        tool_rules=[("add 2 and 3", [("add", {"a": 2, "b": 3})])],
    )
    harness = sdk_program(
        tmp_path,
        f"""
        tools = [{ADD_TOOL!r}]
        messages = [{{"role": "user", "content": "add 2 and 3"}}]
        first = client.messages.create(model="claude-x", max_tokens=64, tools=tools,
                                       messages=messages)
        (use,) = [b for b in first.content if b.type == "tool_use"]
        messages += [
            {{"role": "assistant", "content": first.content}},
            {{"role": "user", "content": [{{"type": "tool_result", "tool_use_id": use.id,
                                          "content": str(use.input["a"] + use.input["b"])}}]}},
        ]
        second = client.messages.create(model="claude-x", max_tokens=64, tools=tools,
                                        messages=messages)
        try:
            client.messages.create(model="claude-x", max_tokens=8, messages=messages,
                                   tools=[{{"type": "web_search_20250305", "name": "web_search"}}])
            refused = None
        except anthropic.BadRequestError as exc:
            refused = [exc.status_code, exc.body["error"]["type"]]
        answer({{"first": [first.stop_reason, use.name, use.input],
                "second": [second.stop_reason, second.content[0].text], "refused": refused}})
        """,
    )
    with ScriptedOpenAIServer(policy) as server:
        result = rollout(harness, server.url, expected="")

    assert result.answer == {
        "first": ["tool_use", "add", {"a": 2, "b": 3}],
        "second": ["end_turn", "the sum is 5"],
        "refused": [400, "invalid_request_error"],
    }, result.detail
    first, second = sorted(steps(result, "model_call"), key=lambda c: c["call"])
    assert first["tools"][0]["function"]["name"] == "add"
    assert first["tool_calls"][0]["name"] == "add"
    tool_message = second["messages"][-1]
    assert tool_message == {
        "role": "tool",
        "tool_call_id": first["tool_calls"][0]["id"],
        "content": "5",
    }
    # The tool result continues the conversation of the call that asked for the tool.
    assert (second["parent"], second["relation"], second["session"]) == (0, "continues", 0)
    assert len(server.policy.requests) == 2  # the refused request never reached the policy


def test_the_anthropic_sdk_streams_text_and_tool_use(tmp_path):
    policy = ScriptedPolicy(
        rules=[("sky", "yes")], tool_rules=[("add 2 and 3", [("add", {"a": 2, "b": 3})])]
    )
    harness = sdk_program(
        tmp_path,
        f"""
        with client.messages.stream(model="claude-x", max_tokens=20,
                                    messages=[{{"role": "user", "content": task["question"]}}]) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
        with client.messages.stream(model="claude-x", max_tokens=20, tools=[{ADD_TOOL!r}],
                                    messages=[{{"role": "user", "content": "add 2 and 3"}}]) as s:
            used = s.get_final_message()
        events = client.messages.create(model="claude-x", max_tokens=20, stream=True,
                                        messages=[{{"role": "user", "content": "sky?"}}])
        kinds = [event.type for event in events]
        answer({{"text": text, "final": [final.stop_reason, final.usage.output_tokens],
                "tool": [used.stop_reason, used.content[0].name, used.content[0].input],
                "kinds": kinds}})
        """,
    )
    with ScriptedOpenAIServer(policy) as server:
        result = rollout(harness, server.url, expected="")

    assert result.answer == {
        "text": "yes",
        "final": ["end_turn", 1],
        "tool": ["tool_use", "add", {"a": 2, "b": 3}],
        "kinds": [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ],
    }, result.detail
    assert result.model_calls == 3


def test_a_message_past_max_model_calls_ends_the_rollout_as_a_limit(tmp_path):
    harness = sdk_program(
        tmp_path,
        """
        for _ in range(3):
            client.messages.create(model="claude-x", max_tokens=8,
                                   messages=[{"role": "user", "content": task["question"]}])
        answer("yes")
        """,
        limits="max_model_calls = 1",
    )
    with ScriptedOpenAIServer(ScriptedPolicy(rules=[("sky", "yes")])) as server:
        result = rollout(harness, server.url)

    assert (result.outcome, result.error_kind) == (RolloutOutcome.HARNESS_ERROR, ErrorKind.LIMIT)
    assert "max_model_calls = 1" in result.detail
    assert result.model_calls == 1 and len(server.policy.requests) == 1


def test_system_messages_among_the_messages_join_the_system_prompt():
    """Claude Code sends part of its system prompt as messages of role system."""
    chat, _ = anthropic_messages.chat_request(
        {
            "max_tokens": 10,
            "system": [{"type": "text", "text": "You are Claude Code."}],
            "messages": [
                {"role": "user", "content": "fix it"},
                {"role": "system", "content": [{"type": "text", "text": "cwd: /app"}]},
                {"role": "system", "content": []},
                {"role": "assistant", "content": "ok"},
            ],
        }
    )
    assert chat["messages"] == [
        {"role": "system", "content": "You are Claude Code.\n\ncwd: /app"},
        {"role": "user", "content": "fix it"},
        {"role": "assistant", "content": "ok"},
    ]
    with pytest.raises(anthropic_messages.BadRequest, match=r"messages\[1\]: a system message"):
        anthropic_messages.chat_request(
            {
                "max_tokens": 10,
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "system", "content": [{"type": "image", "source": {}}]},
                ],
            }
        )
