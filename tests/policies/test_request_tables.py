"""What each endpoint kind's requests carry (coevo/policies/request_tables.py): the exact bodies
a scripted server receives per kind, and the sampling a model-call step records as applied."""

from __future__ import annotations

import pytest

from coevo.policies.client import PolicyClient, Sampling, ServerFlavor
from coevo.policies.request_tables import request_for_kind
from tests.conftest import SEED_HARNESS
from tests.support.harnesses import humaneval_rollout

SAMPLING = Sampling(max_tokens=32, temperature=0.7, top_p=0.9, stop=("\n",), seed=3)
OPENAI_SAMPLING = {
    "max_tokens": 32,
    "temperature": 0.7,
    "top_p": 0.9,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "stop": ["\n"],
    "seed": 3,
}
# What each kind adds: the neutral value of each sampling knob it has beyond OpenAI's, so that
# the server's own defaults (vLLM's generation_config.json, llama-cpp-python's request model)
# never apply unrecorded.
EXTRA = {
    "vllm": {"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0},
    "llamacpp": {"top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0},
    "openai-compatible": {},
}


def send(url: str, kind: str, api: str, body: dict) -> object:
    with PolicyClient(url, model="scripted", kind=kind, retries=0) as client:
        return client.forward(api, body)


@pytest.mark.parametrize("kind", ["vllm", "llamacpp", "openai-compatible"])
def test_a_completion_carries_every_sampling_parameter_the_kind_has(scripted_policy, kind):
    with PolicyClient(scripted_policy.url, model="scripted", kind=kind, retries=0) as client:
        completion = client.complete("def f():", SAMPLING)

    (request,) = scripted_policy.requests
    assert request == {
        "path": "/v1/completions",
        "model": "scripted",
        "prompt": "def f():",
        "stream": False,
        **OPENAI_SAMPLING,
        **EXTRA[kind],
    }
    # What applied, as the model-call step records it: every parameter sent, content aside.
    assert completion.sampling == {**OPENAI_SAMPLING, **EXTRA[kind]}
    assert completion.dropped == ()


@pytest.mark.parametrize("kind", ["vllm", "llamacpp", "openai-compatible"])
def test_a_chat_request_keeps_what_the_kind_takes_and_leaves_out_the_rest(scripted_policy, kind):
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        **OPENAI_SAMPLING,
        "n": 1,
        "logprobs": True,
        "top_logprobs": 2,
        "return_token_ids": True,  # vLLM's extension
    }

    completion = send(scripted_policy.url, kind, "chat", body)

    (request,) = scripted_policy.requests
    sent = {k: v for k, v in request.items() if k not in ("path", "messages", "model", "stream")}
    options = {**OPENAI_SAMPLING, "n": 1, "logprobs": True, "top_logprobs": 2}
    if kind == "vllm":
        assert sent == {**options, **EXTRA[kind], "return_token_ids": True}
        assert completion.dropped == ()
    else:
        assert sent == {**options, **EXTRA[kind]}
        assert completion.dropped == ("return_token_ids",)
    assert completion.sampling == sent


def test_a_request_that_names_a_kinds_own_knob_keeps_its_value(scripted_policy):
    send(scripted_policy.url, "vllm", "completions", {"prompt": "x", "top_k": 5, "min_p": 0.1})

    (request,) = scripted_policy.requests
    assert (request["top_k"], request["min_p"], request["repetition_penalty"]) == (5, 0.1, 1.0)


def test_openai_gets_max_completion_tokens_on_chat_and_nothing_it_does_not_know(scripted_policy):
    body = {"messages": [{"role": "user", "content": "hi"}], **OPENAI_SAMPLING}

    completion = send(scripted_policy.url, "openai", "chat", body)
    send(scripted_policy.url, "openai", "completions", {"prompt": "x", **OPENAI_SAMPLING})

    chat, legacy = scripted_policy.requests
    expected = {k: v for k, v in OPENAI_SAMPLING.items() if k != "max_tokens"}
    assert {k: v for k, v in chat.items() if k not in ("path", "messages", "model", "stream")} == {
        **expected,
        "max_completion_tokens": 32,
    }
    assert completion.sampling["max_completion_tokens"] == 32
    # Its completions API still counts max_tokens.
    assert legacy["max_tokens"] == 32 and "max_completion_tokens" not in legacy


@pytest.mark.parametrize(
    "kind, sent",
    [
        ("vllm", {"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}),
        ("llamacpp", {"top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0}),
    ],
)
def test_a_rollouts_model_call_step_records_the_sampling_that_applied(scripted_policy, kind, sent):
    """Through the real sandbox and rollout runner (ctx.llm.complete): the step's sampling is
    what the server got, the kind's own knobs included."""
    result = humaneval_rollout(SEED_HARNESS, scripted_policy.url, kind=kind)

    call = next(step for step in result.steps if step.kind == "model_call")
    request = scripted_policy.requests[0]
    assert call.payload["sampling"] == {
        k: v for k, v in request.items() if k not in ("path", "prompt", "model", "stream")
    }
    assert sent.items() <= call.payload["sampling"].items()
    other = {"repeat_penalty", "repetition_penalty"} - set(sent)
    assert not other & set(request)


@pytest.mark.parametrize(
    ("kind", "key", "api", "kept"),
    [
        ("llamacpp", "grammar", "chat", True),
        ("llamacpp", "grammar", "completions", True),
        ("vllm", "response_format", "completions", True),
        ("openai-compatible", "grammar", "chat", False),
        ("openai", "response_format", "completions", False),
    ],
)
def test_a_servers_own_answer_constraint_goes_only_to_its_kind(kind, key, api, kept):
    """The llm-patch proposer's answer is held by a GBNF grammar (llama.cpp) or a JSON schema
    (vLLM, also on completions): a kind that does not take it never gets it."""
    sent, dropped = request_for_kind(kind, api, {"model": "m", key: {"x": 1}})
    assert (key in sent, key in dropped) == (kept, not kept)


def test_an_openai_compatible_endpoint_is_spoken_to_as_what_it_showed_it_is():
    client = PolicyClient("http://127.0.0.1:9/v1", model="m")
    client.kind_learn(ServerFlavor.LLAMA_CPP_PYTHON)
    assert client.kind == "llamacpp"
    client.kind_learn(ServerFlavor.VLLM)  # learned once: a kind it has is kept
    assert client.kind == "llamacpp"
    declared = PolicyClient("http://127.0.0.1:9/v1", model="m", kind="openai")
    declared.kind_learn(ServerFlavor.VLLM)
    assert declared.kind == "openai"


EPHEMERAL = {"type": "ephemeral"}
# A chat request as the boundary makes it from a Messages request with prompt-cache markers
# and a failed tool result (workers/anthropic_messages.py).
MARKED_CHAT = {
    "messages": [
        {
            "role": "system",
            "content": [
                {"type": "text", "text": "You are Claude Code.", "cache_control": EPHEMERAL},
                {"type": "text", "text": "cwd: /app"},
            ],
        },
        {"role": "user", "content": [{"type": "text", "text": "add", "cache_control": EPHEMERAL}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "adding ", "cache_control": EPHEMERAL},
                {"type": "text", "text": "now"},
            ],
            "tool_calls": [
                {
                    "id": "t1",
                    "type": "function",
                    "function": {"name": "add", "arguments": "{}"},
                    "cache_control": EPHEMERAL,
                }
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "no a", "is_error": True},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
    ],
    "tools": [
        {"type": "function", "function": {"name": "add"}, "cache_control": EPHEMERAL},
    ],
}


@pytest.mark.parametrize("kind", ["vllm", "llamacpp", "openai-compatible", "openai"])
def test_a_kind_that_takes_no_prompt_cache_markers_gets_the_request_without_them(kind):
    """Anthropic's markers and error flag go to no other kind (OpenAI's API refuses a key it
    does not know inside a message), each named once among the keys left out; a message that
    lost its markers is what it would have been without them (llama-cpp-python's server takes
    a system message only as one string)."""
    sent, dropped = request_for_kind(kind, "chat", {"model": "m", **MARKED_CHAT})

    assert sent["messages"] == [
        {"role": "system", "content": "You are Claude Code.\n\ncwd: /app"},
        {"role": "user", "content": "add"},
        {
            "role": "assistant",
            "content": "adding now",
            "tool_calls": [
                {"id": "t1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "t1", "content": "no a"},
        # Unmarked parts stay as the harness sent them.
        MARKED_CHAT["messages"][4],
    ]
    assert sent["tools"] == [{"type": "function", "function": {"name": "add"}}]
    assert dropped == ["cache_control", "is_error"]
    # The caller's request is left as it was (the trace records what the harness sent).
    assert MARKED_CHAT["messages"][0]["content"][0]["cache_control"] == EPHEMERAL


def test_the_anthropic_kind_keeps_the_markers_for_its_translation():
    sent, dropped = request_for_kind("anthropic", "chat", {"model": "m", **MARKED_CHAT})
    assert (sent["messages"], sent["tools"], dropped) == (
        MARKED_CHAT["messages"],
        MARKED_CHAT["tools"],
        [],
    )
