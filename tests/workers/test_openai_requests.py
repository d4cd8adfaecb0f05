"""What the boundary sends on to the policy server from a program's request."""

from __future__ import annotations

import pytest

from workers.openai_requests import BadRequest, check_request


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
