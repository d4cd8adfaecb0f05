"""OpenAI's Responses API at the model boundary, as the policy server's chat API.

Codex CLI and the OpenAI Agents SDK speak ``POST /v1/responses``, not the chat API. The
boundary (workers/boundary.py) serves that route as it serves Anthropic's (see
workers/anthropic_messages.py): a Responses request becomes a chat request, then checked,
counted and recorded exactly as one sent to ``/v1/chat/completions``, and the policy server's
chat reply becomes a Response. No I/O here but the store of earlier conversations.

What maps to what:

- ``instructions`` → a leading ``system`` message (not carried over by
  ``previous_response_id``, as OpenAI's API does not carry it);
- ``input``, a string → one user message; a list of items → chat messages: a ``message`` item
  (or any item with a ``role`` and no ``type``) with its text (``input_text``,
  ``output_text``, ``refusal``) and ``input_image`` parts (``developer`` becomes ``system``,
  which chat servers know); ``function_call`` items → the ``tool_calls`` of the assistant
  message before them (``call_id`` as the call's id); ``function_call_output`` → a ``tool``
  message; ``reasoning`` items are dropped (the policy never made them);
- ``tools`` (flat function tools: name, description, parameters, strict) → chat function
  tools; ``tool_choice`` as the chat API has it; ``parallel_tool_calls`` as it is;
- ``max_output_tokens`` → ``max_tokens``; ``temperature``, ``top_p`` as they are;
  ``text.format`` json_object / json_schema → ``response_format``;
- ``previous_response_id`` → the conversation of that response (its messages and its reply)
  before the new input, from ``ResponseStore``: the boundary's own, one per rollout, so a
  program can only continue a response its own rollout got;
- the reply: its text as a ``message`` item, each tool call as a ``function_call`` item,
  ``finish_reason`` length as ``status: incomplete`` with ``max_output_tokens``, usage
  prompt / completion tokens as input / output tokens.

Accepted and ignored, and reported as the request's dropped keys (the trace records them):
``reasoning``, ``include``, ``truncation``, ``user``, ``service_tier``, ``text.verbosity`` and
keys this module does not know. Refused (400, naming the field): built-in tools (web search,
file search, computer use, code interpreter, MCP, …: no policy server behind the boundary runs
them), items and parts the chat API cannot hold (files, audio, item references), and
``background``, ``conversation``, ``prompt``, ``max_tool_calls`` and ``top_logprobs`` when
set, which the boundary cannot honour.
"""

from workers.openai_responses.replies import new_id, response, stream_events
from workers.openai_responses.requests import (
    MAX_DROPPED,
    Request,
    UnknownResponse,
    parse_request,
)
from workers.openai_responses.store import ResponseStore

PATHS = ("/v1/responses", "/responses")

__all__ = [
    "MAX_DROPPED",
    "PATHS",
    "Request",
    "ResponseStore",
    "UnknownResponse",
    "new_id",
    "parse_request",
    "response",
    "stream_events",
]
