"""What each kind of policy endpoint accepts in a request: one table per kind.

A model call reaches the policy client in OpenAI's vocabulary (the boundary's and ctx.llm's
requests: ``max_tokens``, ``temperature``, ``top_p``, penalties, ``seed``, ``stop``, ``n``,
``logprobs``, tools, ``response_format``, vLLM's ``return_token_ids``). Before it is sent, the
table of the endpoint's kind decides what goes:

- a parameter the kind does not accept is left out (and named, for the trace): OpenAI's API
  refuses what it does not know ("Unrecognized request argument"), vLLM logs a warning for
  each, and llama.cpp silently ignores it;
- each sampling parameter the kind has and coevo's request does not name is sent with its
  neutral value, the one that makes it do nothing. Otherwise the server's own default applies
  and no trace records it: vLLM fills what a request leaves out from the model's
  ``generation_config.json`` (Gemma 3's: top_k 64, top_p 0.95), llama-cpp-python from its
  request model (top_k 40, min_p 0.05, repeat_penalty 1.1, max_tokens 16). With these, one
  request samples from the same distribution on every kind: OpenAI's, which has no top-k,
  min-p or repetition penalty;
- a parameter the kind spells otherwise is renamed (OpenAI's chat API takes
  ``max_completion_tokens``; its older ``max_tokens`` is refused by its reasoning models).

``sampling_of`` is what a model-call trace step records as the sampling that applied: the
request's parameters as sent, under the names the server read, its content aside.

The Anthropic Messages API is a kind of its own (``anthropic``): its request is not OpenAI's,
so its table lists what coevo's translation (coevo/policies/anthropic_api.py) may carry. It
alone takes what rides inside a chat request's messages and tools for Anthropic: prompt-cache
markers (``cache_control``) and a tool result's ``is_error`` (workers/chat_extensions.py).
Every other kind's request goes without them, each named among the keys left out: OpenAI's
API refuses a key it does not know inside a message too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from workers import chat_extensions

# A request's content (what is asked, and how the answer is shaped), as against its sampling
# and reply options: what a trace step shows apart.
CONTENT_KEYS = frozenset(
    {"model", "stream", "prompt", "messages", "system", "tools", "tool_choice", "response_format"}
)

# What every OpenAI-compatible server takes, as OpenAI's API documents it: the request's
# content and the sampling parameters both APIs share.
_OPENAI_SHARED = frozenset(
    {
        "model",
        "stream",
        "max_tokens",
        "temperature",
        "top_p",
        "n",
        "stop",
        "seed",
        "frequency_penalty",
        "presence_penalty",
        "logprobs",
    }
)
_OPENAI_CHAT = _OPENAI_SHARED | {
    "messages",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
}
_OPENAI_COMPLETIONS = _OPENAI_SHARED | {"prompt"}


@dataclass(frozen=True)
class RequestTable:
    """One endpoint kind's request parameters, per API (``chat``, ``completions``)."""

    chat: frozenset[str]
    completions: frozenset[str]
    # Neutral values of the sampling parameters the kind has beyond OpenAI's, sent whenever a
    # request leaves them out.
    neutral: Mapping[str, Any] = field(default_factory=dict)
    # The kind's name for a parameter, per API: {api: {ours: theirs}}.
    renamed: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # The keys of chat_extensions.KEYS the kind takes inside a chat request's messages, content
    # parts and tools (the rest are taken out).
    extensions: frozenset[str] = frozenset()

    def accepts(self, api: str) -> frozenset[str]:
        return self.chat if api == "chat" else self.completions


TABLES: dict[str, RequestTable] = {
    # vLLM's OpenAI server: OpenAI's parameters, its sampling extensions, and the prompt's and
    # reply's token ids. top_k 0 is "every token" (vLLM 0.8 and later; -1 was older releases'
    # spelling and is still accepted); min_p 0 and repetition_penalty 1 do nothing.
    # Its completions API takes response_format too (a JSON schema the llm-patch proposer's
    # answer is held to: coevo/campaigns/answers.py).
    "vllm": RequestTable(
        chat=_OPENAI_CHAT | {"top_k", "min_p", "repetition_penalty", "return_token_ids"},
        completions=_OPENAI_COMPLETIONS
        | {"top_k", "min_p", "repetition_penalty", "return_token_ids", "response_format"},
        neutral={"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0},
    ),
    # llama-cpp-python's server (and the coevo llama.cpp host, which relays to it): OpenAI's
    # parameters and llama.cpp's own. top_k 0 keeps every token (llama.cpp skips top-k at 0 or
    # below), min_p 0 keeps every token, repeat_penalty 1 penalises nothing. Both APIs take a
    # GBNF ``grammar`` (the llm-patch proposer's answer: coevo/campaigns/answers.py).
    "llamacpp": RequestTable(
        chat=_OPENAI_CHAT | {"top_k", "min_p", "repeat_penalty", "grammar"},
        completions=_OPENAI_COMPLETIONS | {"top_k", "min_p", "repeat_penalty", "grammar"},
        neutral={"top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0},
    ),
    # A server known only to speak OpenAI's API (a provider such as OpenRouter, Together or
    # Fireworks, a company gateway, a server of another make): OpenAI's parameters alone, which
    # every such server takes.
    "openai-compatible": RequestTable(chat=_OPENAI_CHAT, completions=_OPENAI_COMPLETIONS),
    # OpenAI's own API. Its chat API counts the reply's tokens as max_completion_tokens (its
    # reasoning models refuse max_tokens); its completions API keeps max_tokens.
    "openai": RequestTable(
        chat=(_OPENAI_CHAT - {"max_tokens"}) | {"max_completion_tokens"},
        completions=_OPENAI_COMPLETIONS,
        renamed={"chat": {"max_tokens": "max_completion_tokens"}},
    ),
    # Anthropic's Messages API, as coevo's translation of a chat request carries it: no seed,
    # penalties, logprobs or n; stop is its stop_sequences. There is no completions API.
    "anthropic": RequestTable(
        chat=frozenset(
            {
                "model",
                "stream",
                "messages",
                "max_tokens",
                "temperature",
                "top_p",
                "stop",
                "n",
                "tools",
                "tool_choice",
                "parallel_tool_calls",
            }
        ),
        completions=frozenset(),
        extensions=chat_extensions.KEYS,
    ),
}


def table_for(kind: str) -> RequestTable:
    """The kind's table; a kind coevo does not know gets OpenAI's (every compatible server
    takes it)."""
    return TABLES.get(kind) or TABLES["openai-compatible"]


def request_for_kind(
    kind: str, api: str, body: Mapping[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """The body to send to an endpoint of ``kind``, and the keys left out (sorted): what the
    kind does not accept, each named by the request's name for it (a key inside the messages
    or tools, such as ``cache_control``, by its own name, once)."""
    table = table_for(kind)
    accepted = table.accepts(api)
    renamed = table.renamed.get(api, {})
    sent: dict[str, Any] = {}
    dropped = []
    for key, value in body.items():
        name = renamed.get(key, key)
        if name in accepted:
            sent[name] = value
        else:
            dropped.append(key)
    for key, value in table.neutral.items():
        if key in accepted:
            sent.setdefault(key, value)
    if api == "chat":
        sent, inner = chat_extensions.chat_without(sent, kept=table.extensions)
        dropped += inner
    return sent, sorted(dropped)


def sampling_of(body: Mapping[str, Any]) -> dict[str, Any]:
    """A body's parameters as sent, its content aside: the sampling that applied and the
    reply's options (``n``, ``logprobs``…), for a model call's trace step."""
    return {key: value for key, value in body.items() if key not in CONTENT_KEYS}
