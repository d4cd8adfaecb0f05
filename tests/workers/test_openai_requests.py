"""What the boundary sends on to the policy server from a program's request."""

from __future__ import annotations

import pytest

from workers.openai_requests import DEFAULT_MAX_TOKENS, BadRequest, check_request


def test_it_keeps_the_known_keys_drops_the_rest_and_makes_sampling_explicit():
    body = {
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": "hi"}],
        "logprobs": True,
        "top_logprobs": 2,
        "return_token_ids": True,  # vLLM returns the token ids with the reply
        "store": True,
        "reasoning_effort": "high",
    }
    clean, dropped = check_request("chat", body, seed=5, max_tokens_left=300)
    assert dropped == ["reasoning_effort", "store"]
    assert "model" not in clean  # the policy's own model is set by the client
    assert clean["logprobs"] is True and clean["top_logprobs"] == 2
    assert clean["return_token_ids"] is True
    assert (clean["temperature"], clean["top_p"], clean["seed"]) == (1.0, 1.0, 5)
    assert clean["max_tokens"] == 300  # the rollout's remaining budget, below 1024


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"content": "no role"}]}, "messages[0]"),
        ({"messages": [{"role": "user"}], "n": 17}, "n"),
        ({"messages": [{"role": "user"}], "temperature": 3}, "temperature"),
        ({"messages": [{"role": "user"}], "tools": [{"type": "function"}]}, "tools[0]"),
    ],
)
def test_it_refuses_a_malformed_request_naming_the_parameter(body, param):
    with pytest.raises(BadRequest) as refused:
        check_request("chat", body, seed=0, max_tokens_left=1000)
    assert refused.value.param == param


def test_a_missing_max_tokens_is_sized_from_the_budget_and_the_context():
    ask = {"messages": [{"role": "user", "content": "x" * 300}]}  # ~100 tokens, estimated long

    def default(**sizes) -> int:
        clean, _ = check_request("chat", ask, seed=1, **sizes)
        return clean["max_tokens"]

    assert default(max_tokens_left=16384) == DEFAULT_MAX_TOKENS  # nothing smaller known
    assert default(max_tokens_left=16384, calls_left=64) == 256  # the budget's share per call
    assert default(max_tokens_left=500, calls_left=1) == 500  # what is left of the budget
    # What the prompt leaves of a context of 512 (its JSON's 300-odd bytes over 3).
    assert 380 <= default(max_tokens_left=16384, context_tokens=512) < 412
    assert default(max_tokens_left=16384, context_tokens=50) == 1  # the server will refuse it
    assert default(max_tokens_left=0) == 1


def test_a_max_tokens_the_request_names_is_kept():
    ask = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 2000}

    clean, _ = check_request(
        "chat", ask, seed=1, max_tokens_left=100, calls_left=100, context_tokens=64
    )

    assert clean["max_tokens"] == 2000  # the server refuses what it cannot serve; not resized
