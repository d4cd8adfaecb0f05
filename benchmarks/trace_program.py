"""The rollout page of a program harness's long trace: its session overview and its boundary
calls with tool calls, against the game trace of benchmarks/traces.py.

A ``--trace-steps`` trace shaped like workers/program.py's: ``--sessions`` agent
conversations run one after another, each a loop of turns where the model calls a tool and the
next call sends the tool's result back (so each call resends its conversation, which grows by
two messages a turn, ``--result-bytes`` of tool result each: ~10 KB by a session's end with
the default, stored compressed past 16 KB with a larger one), every fifth
session with a repeated and a branched call. It is written through the worker's
``TraceWriter``; then page 1 (with the overview), a page in the middle, "load more" (the htmx
partial) and the overview's own query are timed ``--runs`` times each (median), in-process
through Django's test client, as is page 1 of a game trace of the same length for comparison.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/coevo_h9_bench \\
    .venv/bin/python benchmarks/trace_program.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import traces as trace_bench  # noqa: E402  (benchmarks/traces.py: setup, rollouts, timing)

from workers.trace import StepKind  # noqa: E402  (on the path benchmarks/traces.py sets)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression and return the number.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "convert",
            "description": "Convert a quantity between units.",
            "parameters": {
                "type": "object",
                "properties": {
                    "value": {"type": "number"},
                    "from": {"type": "string"},
                    "to": {"type": "string"},
                },
            },
        },
    },
]
SYSTEM = "You are a careful assistant. Use the tools for every computation. " * 3


def call_payload(call, messages, reply, *, session, parent, relation):
    tool_calls = reply.get("tool_calls") or []
    return {
        "api": "chat",
        "via": "boundary",
        "policy_version": "base",
        "messages": messages,
        "tools": TOOLS,
        "sampling": {"max_tokens": 512, "temperature": 0.7, "seed": 1000 + call},
        "n": 1,
        "call": call,
        "session": session,
        "parent": parent,
        "relation": relation,
        "model": "gemma-3-270m",
        "endpoint": "http://127.0.0.1:8080/v1",
        "completion": reply.get("content") or "",
        "finish_reason": "tool_calls" if tool_calls else "stop",
        "tool_calls": [
            {
                "choice": 0,
                "id": c["id"],
                "name": c["function"]["name"],
                "arguments": c["function"]["arguments"],
            }
            for c in tool_calls
        ],  # fmt: skip
        "choices": [{"index": 0, "message": reply, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 40 * len(messages), "completion_tokens": 24},
    }


def program_steps(n: int, *, sessions: int, result_bytes: int) -> list[trace_bench.BenchStep]:
    Step = trace_bench.BenchStep
    steps = [Step(StepKind.START, {"task": "q1", "command": ["python", "agent.py"], "knobs": {}})]
    calls = n - 4  # start, program_output, answer, verdict
    turns = max(1, calls // sessions)
    call = 0
    while call < calls:
        root = call
        messages = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Question {root}: how many metres are 12.5 miles?"},
        ]
        parent, relation = None, "starts"
        first_request = list(messages)
        for turn in range(turns):
            if call >= calls:
                break
            if root % 5 == 0 and turn == 3:  # the same first request again
                request, parent_here, rel = list(first_request), root, "repeats"
            elif root % 5 == 0 and turn == 5:  # the first request with another question
                request = first_request + [{"role": "user", "content": "and in feet?"}]
                parent_here, rel = root, "branches"
            else:
                request, parent_here, rel = list(messages), parent, relation
            reply = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": f"call_{call}", "type": "function",
                     "function": {"name": "calculator" if turn % 2 else "convert",
                                  "arguments": json.dumps({"expression": f"12.5 * 1609.344 + {turn}"})}}
                ],
            }  # fmt: skip
            payload = call_payload(
                call, request, reply, session=root, parent=parent_here, relation=rel
            )
            steps.append(Step(StepKind.MODEL_CALL, payload, (40 * len(request), 24), 150))
            if rel in ("starts", "continues"):
                line = f"{20116.8 + turn:.1f} (turn {turn} of session {root}) "
                result = (line * (result_bytes // len(line) + 1))[:result_bytes]
                messages = messages + [
                    reply,
                    {"role": "tool", "tool_call_id": f"call_{call}", "content": result},
                ]
                parent, relation = call, "continues"
            call += 1
    steps.append(Step(StepKind.PROGRAM_OUTPUT, {"exit_code": 0, "stdout": "done\n" * 20}))
    steps.append(Step(StepKind.ANSWER, {"answer": "20116.8"}))
    steps.append(
        Step(StepKind.VERDICT, {"passed": True, "score": 1.0, "detail": "ok", "output": ""})
    )
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace-steps", type=int, default=5000)
    parser.add_argument("--sessions", type=int, default=250)
    parser.add_argument("--result-bytes", type=int, default=200, help="each tool result")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    trace_bench.setup()
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from django.urls import reverse

    from coevo.evaluations.models import TraceStep
    from coevo.evaluations.selectors import rollout_call_tree

    project, user, (program, game) = trace_bench.make_rollouts(2)
    steps = program_steps(args.trace_steps, sessions=args.sessions, result_bytes=args.result_bytes)
    trace_bench.ingest(program, steps)
    trace_bench.ingest(game, trace_bench.game_steps(args.trace_steps, prompt_bytes=2048))
    stored = TraceStep.objects.filter(rollout=program)
    sizes = [len(json.dumps(s.payload)) for s in steps if s.kind == StepKind.MODEL_CALL]
    print(
        f"program trace: {stored.count()} steps, {args.sessions} sessions, payloads "
        f"{statistics.mean(sizes) / 1024:.1f} KB on average (largest {max(sizes) / 1024:.1f} KB), "
        f"{stored.filter(payload_zlib__isnull=False).count()} stored compressed"
    )
    client = Client(HTTP_HOST="localhost")
    client.force_login(user)
    base = reverse("web:rollout", args=[project.slug, program.id])
    client.get(base)  # warm: templates compiled, connection open
    middle = args.trace_steps // 2
    with CaptureQueriesContext(connection) as queries:
        client.get(base)
    print(f"page 1: {sum('tracestep' in q['sql'] for q in queries.captured_queries)} trace queries")
    for label, url in (
        ("page 1 (with the overview)", base),
        (f"page from step {middle}", f"{base}?from=1.{middle}"),
        ("load more (htmx partial)", f"{base}?from=1.{middle}"),
        (f"page from step {args.trace_steps - 100}", f"{base}?from=1.{args.trace_steps - 100}"),
    ):
        if label.startswith("load more"):
            client.defaults["HTTP_HX_REQUEST"] = "true"
        ms, size = trace_bench.timed_get(client, url, args.runs)
        client.defaults.pop("HTTP_HX_REQUEST", None)
        print(
            f"open {args.trace_steps}-step program trace, {label}: median {ms:.0f} ms ({size:,} bytes)"
        )
    for label, limit in (
        ("page 1", 500),
        (f"page from step {middle}", middle + 100),
        ("every call", args.trace_steps),
    ):
        times = []
        for _ in range(args.runs):
            started = time.perf_counter()
            rows = rollout_call_tree(rollout=program, limit=limit)
            times.append(time.perf_counter() - started)
        print(
            f"the tree's query, as for {label}: {len(rows)} calls, "
            f"median {statistics.median(times) * 1000:.0f} ms"
        )
    game_url = reverse("web:rollout", args=[project.slug, game.id])
    client.get(game_url)
    ms, size = trace_bench.timed_get(client, game_url, args.runs)
    print(f"open {args.trace_steps}-step game trace, page 1: median {ms:.0f} ms ({size:,} bytes)")


if __name__ == "__main__":
    main()
