"""Exports of program harnesses' rollouts: the boundary's records as TRL's conversational
examples with tools, with the provenance, harness matching and held-out seal of every export.

The first test runs everything for real (a Celery worker, the sandbox, the boundary, the
unmodified openai SDK against the scripted server); the others write boundary-shaped steps
through the real claim/finish services to pin choices, branches and malformed calls."""

from __future__ import annotations

import json
import textwrap

import pytest

from coevo.evaluations.models import Rollout, TraceStep
from coevo.evaluations.services import evaluation_create
from coevo.exports.services import export_path, trajectory_export_create
from harness_store.services import candidate_import_directory
from tests.conftest import wait_until_final
from tests.exports.conftest import build, lines, run_evaluation, wait_ready
from tests.support.factories import (
    ASKS_THE_MODEL,
    jsonl_rows,
    make_agent_candidate,
    make_jsonl_suite,
)

SEALED = "SEALED-HELDOUT-TOOL-MARKER"

# An agent written against the OpenAI API and nothing of coevo's: it offers a tool, runs the
# calls the model asks for, and answers with the model's final text.
TOOL_AGENT = """
import json, os
from openai import OpenAI

client = OpenAI()
task = json.load(open(os.environ["COEVO_TASK_FILE"]))
tools = [{"type": "function", "function": {
    "name": "add", "description": "Add two numbers.",
    "parameters": {"type": "object", "properties": {
        "a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}}]
messages = [{"role": "system", "content": "Use the tools."},
            {"role": "user", "content": task["input"]}]
first = client.chat.completions.create(model="gpt-4o", messages=messages, tools=tools)
asked = first.choices[0].message
messages.append(asked.model_dump(exclude_none=True))
for call in asked.tool_calls or []:
    arguments = json.loads(call.function.arguments)
    messages.append({"role": "tool", "tool_call_id": call.id,
                     "content": str(arguments["a"] + arguments["b"])})
final = client.chat.completions.create(model="gpt-4o", messages=messages, tools=tools)
json.dump(final.choices[0].message.content, open(os.environ["COEVO_ANSWER_FILE"], "w"))
"""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    }
]


def import_program(project, tmp_path, name: str, files: dict[str, str], command: str):
    directory = tmp_path / name
    directory.mkdir()
    (directory / "harness.toml").write_text(
        f'[harness]\nname = "{name}"\ncommand = {command}\ncomponents = ["agent.py"]\n'
    )
    for path, text in files.items():
        (directory / path).write_text(textwrap.dedent(text))
    candidate, _ = candidate_import_directory(
        project=project, directory=directory, message=name, author_name="Tester"
    )
    return candidate


@pytest.fixture
def adding_suite(project):
    return make_jsonl_suite(
        project,
        jsonl_rows(
            [
                ("two", "add 2 and 3", "5", "search"),
                ("four", "add 4 and 4", "8", "search"),
                ("sealed", f"add 6 and 7 {SEALED}", "13", "heldout"),
            ]
        ),
        name="adding",
    )


def test_a_tool_calling_program_exports_as_trl_conversations_with_tools(
    celery_worker_thread, project, owner, adding_suite, policy_version, scripted_policy, tmp_path
):
    scripted_policy.rules += [("5", "5"), ("8", "8"), ("13", "13")]
    scripted_policy.tool_rules += [
        ("add 2 and 3", [("add", {"a": 2, "b": 3})]),
        ("add 4 and 4", [("add", {"a": 4, "b": 4})]),
        (SEALED, [("add", {"a": 6, "b": 7, "note": SEALED})]),
    ]
    program = import_program(
        project, tmp_path, "tool-agent", {"agent.py": TOOL_AGENT}, '["python3", "agent.py"]'
    )
    agent = make_agent_candidate(project, tmp_path, "ctx-agent", ASKS_THE_MODEL)
    searched = wait_until_final(
        evaluation_create(
            candidate=program, suite=adding_suite, split="search", policy_version=policy_version
        )
    )
    assert list(searched.rollouts.values_list("outcome", flat=True)) == ["passed", "passed"]
    heldout = wait_until_final(
        evaluation_create(
            candidate=program,
            suite=adding_suite,
            split="heldout",
            policy_version=policy_version,
            purpose="promotion",
        )
    )
    assert heldout.rollouts.get().outcome == "passed"  # it ran, and it saw the marker
    wait_until_final(
        evaluation_create(
            candidate=agent, suite=adding_suite, split="search", policy_version=policy_version
        )
    )

    for fmt in ("chat", "prompt_completion"):
        export = wait_ready(
            trajectory_export_create(
                project=project, format=fmt, candidate=program, created_by=owner
            )
        )
        assert SEALED not in export_path(sha256=export.sha256).read_text()
        rows = lines(export)
        assert (export.rows, export.rollouts) == (4, 2) == (len(rows), 2)
        assert {r["provenance"]["harness_sha"] for r in rows} == {program.sha}
        rows.sort(key=lambda r: (r["provenance"]["task"], r["provenance"]["call"]))
        asks, answers = rows[2], rows[3]  # task "two": the call that asks for the tool, then
        assert asks["tools"] == answers["tools"] == TOOLS
        rollout = Rollout.objects.get(evaluation=searched, task__key="two")
        recorded = sorted(
            (s.payload for s in TraceStep.objects.filter(rollout=rollout, kind="model_call")),
            key=lambda p: p["call"],
        )
        call_id = recorded[0]["tool_calls"][0]["id"]
        tool_call = {
            "type": "function",
            "id": call_id,
            "function": {"name": "add", "arguments": {"a": 2, "b": 3}},
        }
        conversation = [
            {"role": "system", "content": "Use the tools."},
            {"role": "user", "content": "add 2 and 3"},
        ]
        history = [
            *conversation,
            {"role": "assistant", "content": "", "tool_calls": [tool_call]},
            {"role": "tool", "tool_call_id": call_id, "name": "add", "content": "5"},
        ]
        if fmt == "chat":
            assert asks["messages"] == [
                *conversation,
                {"role": "assistant", "content": "", "tool_calls": [tool_call], "weight": 1},
            ]
            assert answers["messages"] == [
                *history,
                {"role": "assistant", "content": "5", "weight": 1},
            ]
        else:
            assert (asks["prompt"], asks["completion"]) == (
                conversation,
                [{"role": "assistant", "content": "", "tool_calls": [tool_call]}],
            )
            assert (answers["prompt"], answers["completion"]) == (
                history,
                [{"role": "assistant", "content": "5"}],
            )
        provenance = answers["provenance"]
        assert provenance == {
            **provenance,
            "via": "boundary",
            "call": 1,
            "session": 0,
            "parent": 0,
            "relation": "continues",
            "choice": 0,
            "finish_reason": "stop",
            "task": "two",
            "split": "search",
            "outcome": "passed",
            "turn": 1,
            "turns": 2,
            "rollout": str(rollout.id),
        }
        assert asks["provenance"]["finish_reason"] == "tool_calls"

    # The agent:run harness's rows are as they always were: no tools, no call tree.
    plain = lines(
        build(
            trajectory_export_create(
                project=project, format="chat", candidate=agent, created_by=owner
            )
        )
    )
    assert plain and all(set(r) == {"messages", "weight", "provenance"} for r in plain)
    assert all("via" not in r["provenance"] for r in plain)
    assert [sorted(m) for m in plain[0]["messages"]] == [
        ["content", "role"],
        ["content", "role", "weight"],
    ]


def boundary_call(index: int, messages, choices, **extra) -> dict:
    """A model_call step as workers/program.py records one."""
    tool_calls = [
        {
            "choice": c,
            "id": call.get("id"),
            "name": call["function"]["name"],
            "arguments": call["function"]["arguments"],
        }
        for c, choice in enumerate(choices)
        for call in (choice.get("message") or {}).get("tool_calls") or []
    ]
    first = choices[0]
    return {
        "api": "chat",
        "via": "boundary",
        "policy_version": "default",
        "messages": messages,
        "sampling": {"n": len(choices)},
        "n": len(choices),
        "call": index,
        "session": 0,
        "parent": None if index == 0 else 0,
        "relation": "starts" if index == 0 else "branches",
        "model": "scripted",
        "completion": (first.get("message") or {}).get("content") or "",
        "finish_reason": first.get("finish_reason"),
        "tool_calls": tool_calls,
        "choices": choices,
        **extra,
    }


def write_steps(evaluation, payloads: list[dict]) -> None:
    rollout = evaluation.rollouts.get()
    TraceStep.objects.bulk_create(
        TraceStep(rollout=rollout, attempt=1, index=i, kind="model_call", payload=payload)
        for i, payload in enumerate(payloads)
    )


@pytest.mark.django_db(transaction=True)
def test_every_choice_of_a_call_is_a_row_and_refused_calls_are_none(
    project, owner, seed_candidate, humaneval_suite, policy_version
):
    evaluation = run_evaluation(
        seed_candidate, humaneval_suite, policy_version, results=[("passed", 1.0)], calls=0
    )
    user = [{"role": "user", "content": "add 2 and 3"}]
    write_steps(
        evaluation,
        [
            boundary_call(
                0,
                user,
                [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "5"},
                        "finish_reason": "stop",
                    },
                    {
                        "index": 1,
                        "message": {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [
                                # A model's malformed arguments stay what it wrote.
                                {
                                    "id": "c1",
                                    "type": "function",
                                    "function": {"name": "add", "arguments": "{a: 2"},
                                },
                                {
                                    "id": "c2",
                                    "type": "function",
                                    "function": {"name": "add", "arguments": "[2, 3]"},
                                },
                            ],
                        },
                        "finish_reason": "tool_calls",
                    },
                ],
                tools=TOOLS,
            ),
            # The policy server refused this one (a prompt past its context): nothing to learn.
            {**boundary_call(1, user, [{}]), "rejected": "context length exceeded"},
        ],
    )
    rows = lines(build(trajectory_export_create(project=project, format="chat", created_by=owner)))
    assert [(r["provenance"]["choice"], r["provenance"]["turns"]) for r in rows] == [(0, 1), (1, 1)]
    assert rows[0]["messages"][-1] == {"role": "assistant", "content": "5", "weight": 1}
    assert rows[1]["messages"][-1]["tool_calls"] == [
        {"type": "function", "id": "c1", "function": {"name": "add", "arguments": "{a: 2"}},
        {"type": "function", "id": "c2", "function": {"name": "add", "arguments": "[2, 3]"}},
    ]
    assert rows[1]["messages"][-1]["content"] == "" and rows[1]["tools"] == TOOLS


@pytest.mark.django_db(transaction=True)
def test_a_held_out_program_rollout_never_reaches_an_export_whatever_the_filters(
    project, owner, seed_candidate, humaneval_suite, policy_version
):
    """The seal of tests/exports/test_services.py, with the marker only in what a program
    harness adds: tool schemas, tool-call arguments, tool results and the raw choices."""
    searched = run_evaluation(
        seed_candidate, humaneval_suite, policy_version, results=[("passed", 1.0)], calls=0
    )
    heldout = run_evaluation(
        seed_candidate,
        humaneval_suite,
        policy_version,
        split="heldout",
        results=[("passed", 1.0)],
        calls=0,
    )
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "add", "arguments": json.dumps({"x": SEALED})},
    }
    sealed_tools = [{"type": "function", "function": {"name": "add", "description": SEALED}}]
    messages = [
        {"role": "user", "content": "add"},
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": SEALED},
    ]
    write_steps(
        heldout,
        [
            boundary_call(
                0,
                messages,
                [{"message": {"role": "assistant", "content": None, "tool_calls": [call]}}],
                tools=sealed_tools,
            )
        ],
    )
    write_steps(
        searched,
        [
            boundary_call(
                0,
                [{"role": "user", "content": "add"}],
                [{"message": {"role": "assistant", "content": "ok"}}],
            )
        ],
    )
    for fmt in ("chat", "prompt_completion"):
        for filters in ({}, {"splits": ["search", "validation"]}, {"candidate": seed_candidate}):
            export = build(
                trajectory_export_create(project=project, format=fmt, created_by=owner, **filters)
            )
            assert export.rows == 1
            assert SEALED not in export_path(sha256=export.sha256).read_text()
            assert not export.evaluations.filter(id=heldout.id).exists()


@pytest.mark.django_db(transaction=True)
def test_a_ctx_harness_tool_call_exports_in_the_same_form(
    project, owner, seed_candidate, humaneval_suite, policy_version
):
    """ctx.llm.chat(tools=...) records one sample per step, its tool calls as choice 0's."""
    evaluation = run_evaluation(
        seed_candidate, humaneval_suite, policy_version, results=[("passed", 1.0)], calls=0
    )
    asked = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
    write_steps(
        evaluation,
        [
            {
                "api": "chat",
                "model": "scripted",
                "messages": [
                    {"role": "user", "content": "add"},
                    {"role": "assistant", "content": None, "tool_calls": [asked]},
                    {"role": "tool", "content": "1", "tool_call_id": "c1"},
                ],
                "tools": TOOLS,
                "sample": 0,
                "n": 1,
                "completion": "",
                "finish_reason": "tool_calls",
                "tool_calls": [{"choice": 0, "id": "c2", "name": "add", "arguments": '{"a": 2}'}],
            }
        ],
    )
    (row,) = lines(
        build(
            trajectory_export_create(project=project, format="prompt_completion", created_by=owner)
        )
    )
    assert row["tools"] == TOOLS and "via" not in row["provenance"]
    assert row["prompt"] == [
        {"role": "user", "content": "add"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "id": "c1", "function": {"name": "add", "arguments": {"a": 1}}}
            ],
        },
        {"role": "tool", "content": "1", "tool_call_id": "c1", "name": "add"},
    ]
    assert row["completion"] == [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "id": "c2", "function": {"name": "add", "arguments": {"a": 2}}}
            ],
        }
    ]
