"""Model calls as the rollout page shows them: each message with its role and tool calls, a
tool result named by the call it answers, every choice of the reply (logprobs counted, not
listed), the tools offered, and, for a program harness's calls, the call's place in the tree
(coevo.web.trace_tree); a call that continues its parent shows only the turns that are new.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from coevo.web.trace_tree import CallPlace, CallTree
from workers.trace import ModelCall, StepKind

LOGPROB_PREVIEW = 20


@dataclass(frozen=True)
class ToolCallView:
    name: str
    id: str
    arguments: str  # indented JSON when the arguments parse, else as sent
    valid_json: bool


@dataclass(frozen=True)
class MessageView:
    role: str
    content: str
    tool_calls: list[ToolCallView]
    answers: str  # a tool result: the name (and id) of the tool call it answers
    name: str


@dataclass(frozen=True)
class ChoiceView:
    index: int
    content: str
    tool_calls: list[ToolCallView]
    finish_reason: str
    logprobs: int | None  # how many tokens came with logprobs; None: none sent
    logprob_preview: list[tuple[str, Any]]  # the first LOGPROB_PREVIEW (token, logprob)
    token_ids: int | None


@dataclass(frozen=True)
class ToolView:
    name: str
    description: str
    parameters: str  # indented JSON schema, "" when none


@dataclass(frozen=True)
class ModelCallView:
    place: CallPlace | None
    # A call that continues its parent resends the parent's conversation (the parent's
    # messages, then its reply): those ``earlier`` messages are not shown again when the
    # parent's step is on the page (``earlier_omitted``: a link says where they are), and
    # start collapsed (``earlier_messages``) when it is not; the parent's reply and the new
    # turn are ``recent_messages``.
    earlier_messages: list[MessageView]
    recent_messages: list[MessageView]
    earlier: int
    earlier_omitted: bool
    tools: list[ToolView]
    # The parent offered the very same tools (on this page): named, not listed again.
    same_tools_as_parent: bool
    choices: list[ChoiceView]
    dropped: list[str]
    rejected: str

    @property
    def has_messages(self) -> bool:
        return bool(self.earlier or self.recent_messages)

    @property
    def tool_names(self) -> str:
        return ", ".join(tool.name for tool in self.tools)


def model_call_views(steps: Iterable[Any], *, tree: CallTree | None) -> None:
    """Set ``step.call`` (a ``ModelCallView``) on each model-call step of a page."""
    calls = [
        (s, ModelCall.from_payload(s.payload))
        for s in steps
        if s.kind == StepKind.MODEL_CALL and isinstance(s.payload, dict)
    ]
    shown = {  # (attempt, call) → the call, for the calls on this page
        (s.attempt, call.call): call for s, call in calls if isinstance(call.call, int)
    }
    for step, call in calls:
        place = tree.place(step.attempt, call) if tree is not None else None
        parent = None
        if place is not None and place.parent is not None:
            parent = shown.get((step.attempt, place.parent))
        step.call = model_call_view(call, place=place, parent=parent)


def model_call_view(
    call: ModelCall,
    *,
    place: CallPlace | None = None,
    parent: ModelCall | None = None,
) -> ModelCallView:
    """One call; ``parent``: its parent's, when its step is on the page too."""
    raw = call.messages if isinstance(call.messages, list) else []
    sent = parent.messages if parent is not None else None
    earlier, omitted = 0, False
    if place is not None and place.relation == "continues":
        # The tree says messages[:k + 1] are the parent's k messages and its reply
        # (workers/program.py matches the longest such prefix).
        if isinstance(sent, list) and 0 < len(sent) < len(raw):
            earlier, omitted = len(sent), True
        else:
            replies = [
                i for i, m in enumerate(raw) if isinstance(m, dict) and m.get("role") == "assistant"
            ]
            earlier = replies[-1] if replies else 0
    views = _messages(raw, start=earlier if omitted else 0)
    tools, dropped = call.tools, call.dropped
    return ModelCallView(
        place=place,
        earlier_messages=[] if omitted else views[:earlier],
        recent_messages=views if omitted else views[earlier:],
        earlier=earlier,
        earlier_omitted=omitted,
        tools=[_tool(t) for t in tools if isinstance(t, dict)] if isinstance(tools, list) else [],
        same_tools_as_parent=bool(tools) and parent is not None and parent.tools == tools,
        choices=_choices(call),
        dropped=[str(key) for key in dropped] if isinstance(dropped, list) else [],
        rejected=str(call.rejected or ""),
    )


def _messages(messages: list[Any], *, start: int = 0) -> list[MessageView]:
    """Views of ``messages[start:]``; a tool result is named by the tool call it answers,
    wherever in the conversation that call was."""
    names: dict[str, str] = {}  # tool call id → function name, from earlier assistant turns
    views = []
    for position, message in enumerate(messages):
        if position < start:
            for call in message.get("tool_calls") or [] if isinstance(message, dict) else []:
                function = call.get("function") if isinstance(call, dict) else None
                if isinstance(function, dict) and call.get("id"):
                    names[str(call["id"])] = str(function.get("name") or "?")
            continue
        if not isinstance(message, dict):
            views.append(MessageView("", _text(message), [], "", ""))
            continue
        calls = _tool_calls(message.get("tool_calls"))
        for call in calls:
            if call.id:
                names[call.id] = call.name
        role = str(message.get("role") or "")
        answers = ""
        if role == "tool":
            call_id = str(message.get("tool_call_id") or "")
            name = names.get(call_id) or str(message.get("name") or "")
            answers = f"{name} ({call_id})" if name and call_id else name or call_id or "?"
        elif role == "function":  # the API's older form: the function's name, no id
            answers = str(message.get("name") or "?")
        content = message.get("content")
        views.append(
            MessageView(
                role=role,
                content=_text(content) if content not in (None, "") else "",
                tool_calls=calls,
                answers=answers,
                name=str(message.get("name") or "") if role not in ("tool", "function") else "",
            )
        )
    return views


def _text(content: Any) -> str:
    """Message content: text as is; a list of parts as its text parts (others as JSON)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                parts.append(str(part.get("text", "")))
            else:
                parts.append(json.dumps(part, ensure_ascii=False, default=str))
        return "\n".join(parts)
    return json.dumps(content, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def _tool_calls(calls: Any) -> list[ToolCallView]:
    """An assistant message's or a choice's ``tool_calls`` (the API's nested form)."""
    views = []
    for call in calls if isinstance(calls, list) else []:
        if not isinstance(call, dict):
            continue
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        views.append(_tool_call(call.get("id"), function.get("name"), function.get("arguments")))
    return views


def _tool_call(call_id: Any, name: Any, arguments: Any) -> ToolCallView:
    valid = True
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            # What the model wrote, as it wrote it: a harness failing on bad arguments is
            # exactly what someone reading the trace is looking for.
            parsed, valid = arguments, False
    else:
        parsed = arguments
    text = parsed if isinstance(parsed, str) and not valid else _pretty(parsed)
    return ToolCallView(str(name or "?"), str(call_id or ""), text, valid)


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def _tool(tool: dict[str, Any]) -> ToolView:
    function = tool.get("function") if isinstance(tool.get("function"), dict) else tool
    parameters = function.get("parameters")
    return ToolView(
        name=str(function.get("name") or tool.get("type") or "?"),
        description=str(function.get("description") or ""),
        parameters=_pretty(parameters) if parameters else "",
    )


def _choices(call: ModelCall) -> list[ChoiceView]:
    """The reply's choices as the server sent them; a call recorded without them (an
    ``agent:run`` harness's, or an older trace) has its one completion and tool calls; a
    call the policy server refused has none."""
    raw = call.choices
    if isinstance(raw, list) and raw and all(isinstance(c, dict) for c in raw):
        return [_choice(position, choice) for position, choice in enumerate(raw)]
    if call.completion is None and not call.tool_calls:
        return []
    calls = [
        _tool_call(c.get("id"), c.get("name"), c.get("arguments"))
        for c in call.tool_calls or []
        if isinstance(c, dict)
    ]
    completion = call.completion
    return [
        ChoiceView(
            index=0,
            content=completion if isinstance(completion, str) else _text(completion),
            tool_calls=calls,
            finish_reason=str(call.finish_reason or ""),
            logprobs=None,
            logprob_preview=[],
            token_ids=None,
        )
    ]


def _choice(position: int, choice: dict[str, Any]) -> ChoiceView:
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    if message:
        content = message.get("content")
        text = _text(content) if content not in (None, "") else ""
    else:
        text = str(choice.get("text") or "")
    count, preview = _logprobs(choice.get("logprobs"))
    token_ids = choice.get("token_ids")
    index = choice.get("index")
    return ChoiceView(
        index=index if isinstance(index, int) else position,
        content=text,
        tool_calls=_tool_calls(message.get("tool_calls")),
        finish_reason=str(choice.get("finish_reason") or ""),
        logprobs=count,
        logprob_preview=preview,
        token_ids=len(token_ids) if isinstance(token_ids, list) else None,
    )


def _logprobs(logprobs: Any) -> tuple[int | None, list[tuple[str, Any]]]:
    """(tokens, the first few (token, logprob)): chat's ``content`` list of tokens, or the
    completions API's parallel ``tokens`` / ``token_logprobs`` lists."""
    if not isinstance(logprobs, dict):
        return None, []
    content = logprobs.get("content")
    if isinstance(content, list):
        preview = [
            (str(t.get("token", "")), t.get("logprob"))
            for t in content[:LOGPROB_PREVIEW]
            if isinstance(t, dict)
        ]
        return len(content), preview
    tokens = logprobs.get("tokens")
    if isinstance(tokens, list):
        values = logprobs.get("token_logprobs")
        values = values if isinstance(values, list) else []
        preview = [
            (str(token), values[i] if i < len(values) else None)
            for i, token in enumerate(tokens[:LOGPROB_PREVIEW])
        ]
        return len(tokens), preview
    return None, []
