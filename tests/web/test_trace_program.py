"""The rollout page on a program harness's trace: each boundary call's messages, tool calls and
tool results, its choices, the tools it offered and its place in the call tree (linked to its
parent's step), the session overview above the steps, the program's exit code and stdout, and
a fixed number of queries however long the trace."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from coevo.evaluations.models import (
    EvaluationState,
    Rollout,
    RolloutState,
    TraceStep,
)
from coevo.evaluations.selectors import CallRow, rollout_call_tree
from coevo.evaluations.traces import COMPRESS_OVER_BYTES, TraceWriter
from coevo.suites.models import Split, Task
from coevo.web import trace_calls, trace_tree
from coevo.web.trace_tree import call_tree
from tests.support.factories import Step, make_evaluation, make_rollout
from tests.web.test_pages import text
from workers.outcomes import RolloutOutcome
from workers.trace import ModelCall

pytestmark = pytest.mark.django_db

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers. TOOL-DESCRIPTION-MARKER",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            },
        },
    },
    {"type": "function", "function": {"name": "convert", "parameters": {"type": "object"}}},
]
ASK = {"role": "user", "content": "add 2 and 3"}
ASKED = {
    "role": "assistant",
    "tool_calls": [
        {
            "id": "call_1_0",
            "type": "function",
            "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
        }
    ],
}
ANSWERED = {"role": "tool", "tool_call_id": "call_1_0", "content": "5"}


def boundary_call(
    call: int,
    messages: list[dict[str, Any]],
    *,
    session: int | None,
    parent: int | None = None,
    relation: str | None = "starts",
    content: str | None = "",
    tool_calls: list[tuple[str, str, str]] = (),
    choices: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> Step:
    """A chat call as workers/program.py records it."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in tool_calls
        ]
    finish = "tool_calls" if tool_calls else "stop"
    choices = choices or [{"index": 0, "message": message, "finish_reason": finish}]
    payload = {
        "api": "chat",
        "via": "boundary",
        "policy_version": "base",
        "messages": messages,
        "sampling": {"max_tokens": 1024, "temperature": 1.0, "seed": 11 + call},
        "n": len(choices),
        "call": call,
        "model": "scripted",
        "endpoint": "http://127.0.0.1:9/v1",
        "completion": content or "",
        "finish_reason": finish,
        "tool_calls": [{"choice": 0, "id": i, "name": n, "arguments": a} for i, n, a in tool_calls],
        "choices": choices,
        "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
        **extra,
    }
    if session is not None:
        payload.update(session=session, parent=parent, relation=relation)
    return "model_call", payload, {"prompt_tokens": 7, "completion_tokens": 3, "latency_ms": 40}


def start(task: Task) -> Step:
    payload = {
        "task": task.key,
        "knobs": {"style": "plain"},
        "command": ["python3", "agent.py", "--mode", "two words"],
        "seed": 7,
        "policy_version": "base",
    }
    return "start", payload, {}


def program_steps(task: Task) -> list[Step]:
    """The openai-SDK agent of tests/workers/test_program_harness.py, and a few more calls: a
    tool call and its result, a second session with a repeat, a branch, a refused call."""
    return [
        start(task),
        boundary_call(
            0,
            [ASK],
            session=0,
            tools=TOOLS,
            tool_choice="auto",
            tool_calls=[("call_1_0", "add", '{"a": 2, "b": 3}')],
            content=None,
        ),
        boundary_call(
            1,
            [ASK, ASKED, ANSWERED],
            session=0,
            parent=0,
            relation="continues",
            tools=TOOLS,
            content="the sum is 5",
        ),
        boundary_call(
            2, [{"role": "user", "content": "is the sky blue?"}], session=2, content="yes"
        ),
        boundary_call(
            3,
            [{"role": "user", "content": "is the sky blue?"}],
            session=2,
            parent=2,
            relation="repeats",
            content="yes",
            dropped=["logit_bias", "user"],
            spoken="responses",
        ),
        boundary_call(
            4,
            [ASK, {"role": "user", "content": "and 4?"}],
            session=0,
            parent=0,
            relation="branches",
            content="9",
        ),
        boundary_call(
            5,
            [{"role": "user", "content": "x" * 10}],
            session=None,
            rejected="the prompt is longer than the context window",
            choices=[{}],
        ),
        ("program_output", {"exit_code": 0, "stdout": "thinking…\nSTDOUT-TAIL-MARKER\n"}, {}),
        ("answer", {"answer": "the sum is 5"}, {}),
        ("verdict", {"passed": True, "score": 1.0, "detail": "ok", "output": ""}, {}),
    ]


@pytest.fixture
def evaluation(seed_candidate, humaneval_suite, policy_version):
    return make_evaluation(
        candidate=seed_candidate,
        suite=humaneval_suite,
        policy_version=policy_version,
        state=EvaluationState.PENDING,
    )


@pytest.fixture
def task(humaneval_suite) -> Task:
    return Task.objects.filter(suite=humaneval_suite, split=Split.SEARCH).first()


@pytest.fixture
def program(evaluation, task) -> Rollout:
    return make_rollout(
        evaluation, task, outcome=RolloutOutcome.PASSED, score=1.0, steps=program_steps(task)
    )


def url(project, rollout, **query) -> str:
    base = reverse("web:rollout", args=[project.slug, rollout.id])
    return base + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")


def step_html(page: str, step_id: str) -> str:
    """The rendered <li> of one step."""
    match = re.search(rf'<li class="step [^"]*" id="step-{step_id}">(.*?)\n</li>', page, re.S)
    assert match, f"no step {step_id}"
    return match[1]


def plain_text(html_text: str) -> str:
    """An HTML fragment's text as a browser shows it, whitespace collapsed."""
    return " ".join(re.sub(r"<[^>]+>", "", html_text).split())


def overview_html(page: str) -> str:
    match = re.search(r'<details class="call-overview" id="call-overview" open>(.*?)</details>',
                      page, re.S)  # fmt: skip
    assert match, "no call overview"
    return match[1]


def test_it_shows_a_calls_tool_calls_with_their_arguments(client, owner, project, program):
    client.force_login(owner)
    page = text(client.get(url(project, program)))
    first = step_html(page, "1-1")
    # The reply's tool call: its name, its id and its arguments as indented JSON.
    assert 'calls <code class="tool-name">add</code> <span class="muted">call_1_0</span>' in first
    assert '<pre class="block arguments">{\n  "a": 2,\n  "b": 3\n}</pre>' in first
    assert "finish: tool_calls" in first
    # The tools offered: names in the summary, descriptions and schemas collapsed under it.
    assert "<summary>tools offered: add, convert</summary>" in first
    assert '<details class="tools-offered">' in first
    assert "TOOL-DESCRIPTION-MARKER" in first and '"properties"' in first
    assert 'tool choice <code>"auto"</code>' in first


def test_it_shows_a_tool_result_as_the_result_of_the_call_it_answers(
    client, owner, project, program
):
    client.force_login(owner)
    page = text(client.get(url(project, program)))
    second = step_html(page, "1-2")
    # The assistant turn that asked for the tool, with its call, then the tool's result.
    assistant = second.index('<span class="role">assistant</span>')
    asked = second.index('calls <code class="tool-name">add</code>', assistant)
    result = second.index("tool result for <code>add (call_1_0)</code>")
    assert assistant < asked < result
    assert re.search(r'tool result for <code>add \(call_1_0\)</code></span>\s*'
                     r'<pre class="block prompt">5</pre>', second)  # fmt: skip
    # What the parent sent is shown at the parent's step, not again here: a link says so.
    assert (
        '1 earlier message: what <a href="#step-1-1">#0</a> sent, shown there; then its reply.'
        in second
    )
    assert second.count('<div class="message') == 3 - 1
    assert "add 2 and 3" not in second
    assert '<pre class="block completion">the sum is 5</pre>' in second
    # The same tools as the parent's: named, not listed again.
    assert 'tools offered: add, convert, as to <a href="#step-1-1">#0</a>' in second
    assert "TOOL-DESCRIPTION-MARKER" not in second


def test_it_places_each_call_in_the_tree_and_links_its_parent(client, owner, project, program):
    client.force_login(owner)
    page = text(client.get(url(project, program)))
    heads = {i: plain_text(step_html(page, f"1-{i}")) for i in range(1, 7)}
    assert "call #0 · session 1 · starts the session" in heads[1]
    assert "call #1 · session 1 · continues #0" in heads[2]
    assert "call #2 · session 2 · starts the session" in heads[3]
    assert "call #3 · session 2 · repeats #2" in heads[4]
    assert "call #4 · session 1 · branches from #0" in heads[5]
    # On the same page a parent is an anchor to its step.
    assert '<a class="call-parent" href="#step-1-1">#0</a>' in step_html(page, "1-2")
    assert '<a class="call-parent" href="#step-1-3">#2</a>' in step_html(page, "1-4")
    assert 'id="step-1-1"' in page and 'id="step-1-3"' in page
    # A call the policy server refused has no place but its index, and says why.
    refused = step_html(page, "1-6")
    assert "call #5" in plain_text(refused) and "session" not in plain_text(refused)
    assert "Refused by the policy server: the prompt is longer than the context window" in refused


def test_it_notes_dropped_keys_and_shows_the_programs_command_and_output(
    client, owner, project, program
):
    client.force_login(owner)
    page = text(client.get(url(project, program)))
    assert (
        '<p class="muted dropped">Not forwarded to the policy: <code>logit_bias</code>, '
        "<code>user</code></p>" in step_html(page, "1-4")
    )
    assert "<code class=\"command\">python3 agent.py --mode 'two words'</code>" in page
    # A call the harness made in another API says so (the Responses API, here).
    assert "chat (the harness spoke responses) · scripted" in step_html(page, "1-4")
    assert "the harness spoke" not in step_html(page, "1-1")
    assert "entrypoint" not in step_html(page, "1-0")
    output = step_html(page, "1-7")
    assert "exit code <strong>0</strong>" in output
    assert '<pre class="block output">thinking…\nSTDOUT-TAIL-MARKER\n</pre>' in output


def test_it_draws_the_sessions_as_a_tree_above_the_steps(client, owner, project, program):
    client.force_login(owner)
    page = text(client.get(url(project, program)))
    overview = overview_html(page)
    assert page.index('id="call-overview"') < page.index('id="trace-steps"')
    assert "6 model calls in 2 sessions" in plain_text(overview)
    lines = [plain_text(li) for li in re.findall(r"<li [^>]*>(.*?)</li>", overview, re.S)]
    # Session 1: the conversation #0 → #1 on one line, the branch off #0 one level deeper;
    # session 2: #2, and its repeat.
    assert lines == ["#0 → #1", "branches from #0: #4", "#2", "repeats #2: #3"]
    depths = re.findall(r'<li style="--depth: (\d+)">', overview)
    assert depths == ["0", "1", "0", "1"]
    # Each call links to its step (all on this page: anchors).
    assert '<a class="call-link" href="#step-1-5" title="step #5">#4</a>' in overview
    assert 'href="#step-1-1"' in overview and 'href="#step-1-4"' in overview
    assert "Refused by the policy server: " in overview and 'href="#step-1-6">#5</a>' in overview


def long_program_steps(task: Task, calls: int) -> list[Step]:
    """One conversation of ``calls`` turns, each continuing the one before."""
    steps = [start(task)]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "count"}]
    for call in range(calls):
        steps.append(
            boundary_call(
                call,
                list(messages),
                session=0,
                parent=call - 1 if call else None,
                relation="continues" if call else "starts",
                content=f"turn-{call}",
            )
        )
        messages += [
            {"role": "assistant", "content": f"turn-{call}"},
            {"role": "user", "content": "go on"},
        ]
    return steps


def test_it_links_a_parent_on_another_page_to_the_page_that_shows_it(
    client, owner, project, evaluation, task
):
    rollout = make_rollout(
        evaluation, task, outcome=RolloutOutcome.PASSED, steps=long_program_steps(task, 150)
    )
    client.force_login(owner)
    page = text(client.get(url(project, rollout, **{"from": "1.100"})))
    # Call #99 is step 100, the first of this page; its parent (#98, step 99) is on page 1.
    head = step_html(page, "1-100")
    assert "call #99 · session 1 · continues" in plain_text(head)
    assert '<a class="call-parent" href="?from=1.99#step-1-99">#98</a>' in head
    assert '<a class="call-parent" href="#step-1-100">#99</a>' in step_html(page, "1-101")
    # The conversation #99 resends is not on this page: its earlier turns are there, collapsed;
    # #100's are #99's, which is.
    assert "197 earlier messages (the conversation of #98)" in head
    assert head.count('<div class="message') == 199
    assert step_html(page, "1-101").count('<div class="message') == 2
    # The overview's links: anchors for the steps here, the page that starts at a step else.
    overview = overview_html(page)
    assert '<a class="call-link" href="?from=1.1#step-1-1" title="step #1">#0</a>' in overview
    assert '<a class="call-link" href="#step-1-120" title="step #120">#119</a>' in overview
    # "Load more" gets the same links without the overview.
    partial = text(
        client.get(url(project, rollout, **{"from": "1.100"}), headers={"HX-Request": "true"})
    )
    assert 'id="call-overview"' not in partial
    assert '<a class="call-parent" href="?from=1.99#step-1-99">#98</a>' in partial


def test_it_lists_only_the_first_calls_of_a_long_tree(
    client, owner, project, evaluation, task, monkeypatch
):
    monkeypatch.setattr(trace_tree, "OVERVIEW_MAX_CALLS", 5)
    rollout = make_rollout(
        evaluation, task, outcome=RolloutOutcome.PASSED, steps=long_program_steps(task, 12)
    )
    client.force_login(owner)
    overview = overview_html(text(client.get(url(project, rollout))))
    assert "12 model calls in 1 session · the first 5 listed" in plain_text(overview)
    assert re.findall(r'class="call-link"[^>]*>#(\d+)<', overview) == ["0", "1", "2", "3", "4"]


def test_it_reads_only_the_calls_a_page_needs_on_a_long_trace(
    client, owner, project, evaluation, task
):
    rollout = make_rollout(
        evaluation, task, outcome=RolloutOutcome.PASSED, steps=long_program_steps(task, 700)
    )
    client.force_login(owner)
    first = text(client.get(url(project, rollout)))
    # Page 1 reads the overview's 500 calls: how many sessions the rest make is not known.
    assert "700 model calls · the first 500 listed, in 1 session" in plain_text(
        overview_html(first)
    )
    # A page past them reads up to its own last step, here the end: every call.
    later = text(client.get(url(project, rollout, **{"from": "1.650"})))
    assert "700 model calls in 1 session · the first 500 listed" in plain_text(overview_html(later))
    head = step_html(later, "1-700")
    assert "call #699 · session 1 · continues" in plain_text(head)
    assert '<a class="call-parent" href="#step-1-699">#698</a>' in head


def test_it_shows_every_choice_and_counts_their_logprobs(client, owner, project, evaluation, task):
    tokens = [{"token": f"t{i}", "logprob": -0.5, "top_logprobs": []} for i in range(1500)]
    choices = [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "CHOICE-ZERO"},
            "finish_reason": "stop",
            "logprobs": {"content": tokens},
            "token_ids": list(range(1500)),
        },
        {
            "index": 1,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c9", "type": "function",
                     "function": {"name": "convert", "arguments": "{not json"}}
                ],
            },
            "finish_reason": "tool_calls",
        },
        {"index": 2, "message": {"role": "assistant", "content": "CHOICE-TWO"}, "finish_reason": "length"},
    ]  # fmt: skip
    steps = [start(task), boundary_call(0, [ASK], session=0, choices=choices, tools=TOOLS)]
    rollout = make_rollout(evaluation, task, outcome=RolloutOutcome.PASSED, steps=steps)
    client.force_login(owner)
    call = step_html(text(client.get(url(project, rollout))), "1-1")
    assert "<h4>3 choices</h4>" in call and "3 choices</span>" in call
    assert "CHOICE-ZERO" in call and "CHOICE-TWO" in call
    assert "choice 1 · finish: tool_calls" in call and "choice 2 · finish: length" in call
    # Arguments that are not JSON are shown as the model wrote them, flagged.
    assert '<pre class="block arguments">{not json</pre>' in call
    assert "arguments are not valid JSON" in call
    # Logprobs: a count and the first 20 tokens, collapsed; never a row per token.
    assert "<summary>logprobs of 1,500 tokens</summary>" in call
    assert (
        call.count("<tr>") == 20 and "<code>t19</code>" in call and "<code>t20</code>" not in call
    )
    assert "1,500 token ids recorded" in call


def test_it_reads_the_tree_of_a_compressed_trace_written_by_the_worker(
    client, owner, project, evaluation, task
):
    """Through the TraceWriter: long conversations are stored compressed, with an excerpt;
    the tree's keys survive the excerpt and the page shows the whole payload."""
    rollout = Rollout.objects.create(
        evaluation=evaluation, task=task, seed=1, state=RolloutState.RUNNING, attempts=1
    )
    big = "w" * (COMPRESS_OVER_BYTES + 10)
    calls = [
        boundary_call(0, [{"role": "user", "content": big}], session=0, tools=TOOLS,
                      tool_calls=[("k1", "add", '{"a": 1, "b": 1}')], content=None),
        boundary_call(1, [{"role": "user", "content": big}, ASKED | {"tool_calls": [
            {"id": "k1", "type": "function", "function": {"name": "add", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "k1", "content": "2"}],
            session=0, parent=0, relation="continues", content="TWO-MARKER"),
    ]  # fmt: skip

    class _Step:
        def __init__(self, kind, payload, extra):
            self.kind, self.payload = kind, payload
            self.prompt_tokens = extra.get("prompt_tokens", 0)
            self.completion_tokens = extra.get("completion_tokens", 0)
            self.latency_ms = extra.get("latency_ms", 0)

    with TraceWriter(rollout_id=rollout.id, attempt=1) as writer:
        for step in [start(task), *calls]:
            writer.add(_Step(*step))
    assert TraceStep.objects.filter(rollout=rollout, payload_zlib__isnull=False).count() == 2
    assert [(r.call, r.parent, r.relation) for r in rollout_call_tree(rollout=rollout)] == [
        (0, None, "starts"),
        (1, 0, "continues"),
    ]
    client.force_login(owner)
    page = text(client.get(url(project, rollout)))
    assert "tool result for <code>add (k1)</code>" in step_html(page, "1-2")
    # The whole payload (not its excerpt), once: #1 resends #0's message, shown at #0.
    assert big in step_html(page, "1-1") and big not in step_html(page, "1-2")
    assert "TWO-MARKER" in step_html(page, "1-2")
    assert "#0 → #1" in plain_text(overview_html(page))


def tracestep_queries(client, address: str) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(address)
    assert response.status_code == 200
    return [q["sql"] for q in queries.captured_queries if "tracestep" in q["sql"].lower()]


def test_the_overview_costs_one_query_however_long_the_trace(
    client, owner, project, evaluation, task
):
    short = make_rollout(
        evaluation, task, outcome=RolloutOutcome.PASSED, steps=long_program_steps(task, 3)
    )
    other = Task.objects.filter(suite=task.suite, split=Split.SEARCH).exclude(id=task.id).first()
    long = make_rollout(
        evaluation, other, outcome=RolloutOutcome.PASSED, steps=long_program_steps(other, 400)
    )
    client.force_login(owner)
    counts = []
    for rollout, cursor in ((short, None), (long, None), (long, "1.250")):
        address = url(project, rollout, **({"from": cursor} if cursor else {}))
        queries = tracestep_queries(client, address)
        counts.append(len(queries))
        # The tree's query reads the four keys of the tree, never whole payloads.
        tree = [sql for sql in queries if "'session'" in sql]
        assert len(tree) == 1, queries
        select = tree[0].split(" FROM ")[0]
        assert '"payload" ->' in select or '"payload" -> ' in select
        assert not re.search(r'"payload"(,|\s+FROM)', tree[0].split(" WHERE ")[0]), tree[0]
    # The page, the previous page's cursor (past page 1), two summary aggregates, the tree.
    assert counts == [4, 4, 5]
    assert (short.steps.count(), long.steps.count()) == (4, 401)


def test_it_keeps_a_held_out_program_trace_sealed(
    client, owner, project, seed_candidate, humaneval_suite, policy_version
):
    task = Task.objects.filter(suite=humaneval_suite, split=Split.HELDOUT).first()
    evaluation = make_evaluation(
        candidate=seed_candidate,
        suite=humaneval_suite,
        policy_version=policy_version,
        split=Split.HELDOUT,
        state=EvaluationState.PENDING,
    )
    rollout = make_rollout(
        evaluation, task, outcome=RolloutOutcome.PASSED, steps=program_steps(task)
    )
    client.force_login(owner)
    for response in (
        client.get(url(project, rollout)),
        client.get(url(project, rollout), headers={"HX-Request": "true"}),
    ):
        assert response.status_code == 404
        body = text(response)
        assert "TOOL-DESCRIPTION-MARKER" not in body and "call_1_0" not in body
        assert "call-overview" not in body and "STDOUT-TAIL-MARKER" not in body


# --- the tree on its own ---------------------------------------------------------------------


def rows(*places: tuple[int, int | None, int | None, str | None], attempt: int = 1):
    return [
        CallRow(attempt, index + 1, call, session, parent, relation)
        for index, (call, session, parent, relation) in enumerate(places)
    ]


def test_the_tree_keeps_a_conversation_on_one_line_and_indents_its_forks():
    tree = call_tree(
        rows(
            (0, 0, None, "starts"),
            (1, 0, 0, "continues"),
            (2, 0, 1, "continues"),
            (3, 0, 1, "branches"),
            (4, 0, 3, "continues"),
            (5, 0, 1, "continues"),  # a second continuation of #1 (a retried tool turn)
            (6, 0, 3, "repeats"),
        ),
        on_page=[],
    )
    (session,) = tree.sessions
    drawn = [
        (line.depth, line.parent.call if line.parent else None, [n.call for n in line.calls])
        for line in session.lines
    ]
    assert drawn == [
        (0, None, [0, 1, 2]),
        (1, 1, [3, 4]),
        (2, 3, [6]),
        (1, 1, [5]),
    ]
    assert session.calls == 7 and tree.total == 7


def test_the_tree_numbers_sessions_per_attempt_in_the_order_they_started():
    tree = call_tree(
        rows((0, 0, None, "starts"), (1, 1, None, "starts"), (2, 0, 0, "continues"))
        + rows((0, 0, None, "starts"), attempt=2),
        on_page=[(1, 2)],
    )
    assert [(s.attempt, s.number, s.root, s.calls) for s in tree.sessions] == [
        (1, 1, 0, 2),
        (1, 2, 1, 1),
        (2, 1, 0, 1),
    ]
    assert tree.place(1, ModelCall(call=1)).session == 2
    assert tree.place(2, ModelCall(call=0)).session == 1
    assert tree.place(1, ModelCall(call=2)).parent_link.href == "?from=1.1#step-1-1"
    # A call past the rows read keeps its payload's place, without a number or a link.
    beyond = tree.place(1, ModelCall(call=9, session=0, parent=2, relation="continues"))
    assert (beyond.call, beyond.session, beyond.parent, beyond.parent_link) == (9, None, 2, None)
    assert tree.place(1, ModelCall(completion="no call index")) is None
    assert [n.link.href for line in tree.sessions[1].lines for n in line.calls] == ["#step-1-2"]


def test_the_tree_draws_a_deep_branch_without_recursing():
    deep = [(0, 0, None, "starts")] + [(i, 0, i - 1, "branches") for i in range(1, 3000)]
    tree = call_tree(rows(*deep), on_page=[])
    lines = tree.sessions[0].lines
    assert len(lines) == 500  # the overview's cap
    assert lines[-1].depth == 499 and lines[-1].indent == trace_tree.MAX_DEPTH


def test_it_reads_arguments_given_as_an_object():
    view = trace_calls.model_call_view(ModelCall(
        messages=[{"role": "assistant", "content": None, "tool_calls": [
            {"id": "x", "function": {"name": "f", "arguments": {"q": [1, 2]}}}]}],
    ))  # fmt: skip
    (call,) = view.recent_messages[0].tool_calls
    assert call.valid_json and json.loads(call.arguments) == {"q": [1, 2]}
