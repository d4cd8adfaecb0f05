"""A chat request as Anthropic's Messages API takes it (coevo/policies/anthropic_api.py): the
prompt-cache markers and tool error flags a harness set reach Anthropic where it set them, and
what Anthropic would refuse of them is refused before anything is sent."""

from __future__ import annotations

import pytest

from coevo.errors import PolicyRequestRejected
from coevo.policies.anthropic_api import request_from_chat
from coevo.policies.request_tables import request_for_kind
from workers import anthropic_messages

EPHEMERAL = {"type": "ephemeral"}
HOUR = {"type": "ephemeral", "ttl": "1h"}
ADD = {
    "name": "add",
    "description": "Add two numbers.",
    "input_schema": {"type": "object", "properties": {"a": {"type": "number"}}},
}
# What Claude Code sends, in the shape that matters here: a marked system prompt and tools, a
# tool use answered by a failed result, and its last turn marked.
CLAUDE_CODE = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 64,
    "system": [
        {"type": "text", "text": "You are Claude Code.", "cache_control": HOUR},
        {"type": "text", "text": "cwd: /app"},
    ],
    "tools": [{**ADD, "cache_control": EPHEMERAL}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "add 2 and 3"}]},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 2}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "no b", "is_error": True},
                {"type": "text", "text": "try again", "cache_control": EPHEMERAL},
            ],
        },
    ],
}


def to_anthropic(chat: dict) -> dict:
    sent, dropped = request_for_kind("anthropic", "chat", chat)
    assert dropped == []
    return request_from_chat("chat", sent)


def test_what_a_messages_harness_marked_reaches_anthropic_where_it_marked_it():
    chat, _ = anthropic_messages.chat_request(CLAUDE_CODE)

    request = to_anthropic(chat)

    assert request["system"] == CLAUDE_CODE["system"]
    assert request["tools"] == CLAUDE_CODE["tools"]
    result, again = CLAUDE_CODE["messages"][2]["content"]
    # The result and the text after it as two user turns (a chat's tool message, then its user
    # message), which Anthropic's API combines into one.
    assert request["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "add 2 and 3"}]},
        CLAUDE_CODE["messages"][1],
        {"role": "user", "content": [result]},
        {"role": "user", "content": [again]},
    ]


def test_an_unmarked_system_prompt_is_still_one_string():
    chat, _ = anthropic_messages.chat_request({**CLAUDE_CODE, "system": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]})  # fmt: skip
    assert to_anthropic(chat)["system"] == "a\n\nb"


def test_a_chat_harness_marks_as_gateways_do():
    """An OpenAI-SDK harness marks content parts, tools, tool calls, or a message itself
    (LiteLLM's convention): a message's own marker goes on its last block."""
    request = to_anthropic(
        {
            "messages": [
                {"role": "system", "content": "Be brief.", "cache_control": EPHEMERAL},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "https://x/y.png"}, "cache_control": HOUR}]},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}, "cache_control": EPHEMERAL}]},
                {"role": "tool", "tool_call_id": "c1", "content": "0", "cache_control": EPHEMERAL, "is_error": False},
            ],
            "max_tokens": 8,
        }
    )  # fmt: skip
    assert request["system"] == [{"type": "text", "text": "Be brief.", "cache_control": EPHEMERAL}]
    assert request["messages"] == [
        {"role": "user", "content": [
            {"type": "text", "text": "a"},
            {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}, "cache_control": HOUR},
        ]},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "c1", "name": "add", "input": {}, "cache_control": EPHEMERAL},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "c1", "content": "0", "cache_control": EPHEMERAL},
        ]},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        (
            [{"role": "user", "content": [{"type": "text", "text": "a", "cache_control": {"type": "lasting"}}]}],
            "messages[0].content[0].cache_control must be {'type': 'ephemeral'}",
        ),
        (
            [{"role": "user", "content": "a", "cache_control": {"type": "ephemeral", "ttl": "1d"}}],
            "messages[0].cache_control must be",
        ),
        (
            [{"role": "user", "content": [{"type": "text", "text": str(i), "cache_control": EPHEMERAL} for i in range(5)]}],
            "A maximum of 4 blocks with cache_control may be provided. Found 5.",
        ),
    ],
)  # fmt: skip
def test_a_marker_anthropic_would_refuse_is_the_requests_fault_before_sending(messages, message):
    with pytest.raises(PolicyRequestRejected) as raised:
        request_from_chat("chat", {"messages": messages, "max_tokens": 8})
    assert raised.value.status == 400
    assert message in str(raised.value) and message in raised.value.reply
