"""The trace's step contract (workers/trace.py): every kind a trace holds reads through its
type, a stored trace of today reads unchanged, and what the worker records now is what the
types declare, key for key."""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pytest

from coevo.evaluations.models import EvaluationState, Rollout, RolloutState
from coevo.evaluations.traces import COMPRESS_OVER_BYTES, TraceWriter, trace_page
from coevo.policies.client import PolicyClient
from coevo.suites.models import Split
from tests.support.factories import make_evaluation
from tests.support.harnesses import CORRECT, PROBLEM
from workers.environments import humaneval
from workers.rollout import RolloutInputs, RolloutOutcome, TaskEnvironment, execute_rollout
from workers.trace import (
    STEP_TYPES,
    Answer,
    Environment,
    EnvReset,
    EnvStep,
    Error,
    HarnessException,
    HelperCall,
    Log,
    ModelCall,
    ProgramOutput,
    Start,
    Step,
    StepKind,
    TypedStep,
    UnknownStep,
    Verdict,
    WorkspaceDiff,
    parse_step,
)

REPO = Path(__file__).resolve().parents[2]
COST = {"usd": "0.000012", "price": {"model": "m", "input_per_mtok": "0.1"}}
CHAT = [{"role": "user", "content": "hi"}]

# Payloads as the worker wrote them before the step types existed (workers/rollout.py,
# workers/program.py and coevo/evaluations/services/rollouts.py of that time), one or more per
# kind and shape: what stored traces hold and must keep reading.
STORED_BEFORE_TYPES: list[tuple[str, dict[str, Any]]] = [
    (
        "start",
        {
            "task": "HumanEval/2",
            "knobs": {"temperature": 0.2},
            "entrypoint": "agent:run",
            "seed": 7,
            "policy_version": "base-v1",
            "policy_api": "completions",
            "limits": {"max_model_calls": 8, "wall_time_s": 60},
            "multi_step": False,
            "helpers": ["check"],
        },
    ),
    (
        "start",
        {
            "task": "fix-the-bug",
            "knobs": {},
            "command": ["python", "agent.py"],
            "seed": 0,
            "policy_version": "",
            "policy_api": "chat",
            "limits": {"max_steps": 20},
            "multi_step": False,
            "helpers": ["exec"],
            "workspace": True,
        },
    ),
    (
        "model_call",  # ctx.llm.complete: one step per sample
        {
            "api": "completions",
            "model": "scripted",
            "policy_version": "base-v1",
            "endpoint": "http://127.0.0.1:9/v1",
            "prompt": "def truncate_number",
            "sampling": {"max_tokens": 64, "temperature": 0.0, "seed": 7},
            "sample": 0,
            "n": 2,
            "completion": "    return number % 1.0\n",
            "finish_reason": None,
            "cost": None,
        },
    ),
    (
        "model_call",  # ctx.llm.chat with tools, the server having dropped a key
        {
            "api": "chat",
            "model": "scripted",
            "policy_version": "base-v1",
            "endpoint": "http://127.0.0.1:9/v1",
            "messages": CHAT,
            "tools": [{"type": "function", "function": {"name": "add"}}],
            "tool_choice": "auto",
            "sampling": {"max_tokens": 64},
            "dropped": ["logprobs"],
            "sample": 1,
            "n": 2,
            "completion": "",
            "finish_reason": "tool_calls",
            "cost": COST,
            "tool_calls": [{"id": "c1", "name": "add", "arguments": "{}"}],
            "degraded": [{"field": "tools", "why": "no tool template"}],
        },
    ),
    (
        "model_call",  # a program's call through the boundary
        {
            "api": "chat",
            "via": "boundary",
            "policy_version": "base-v1",
            "messages": CHAT,
            "sampling": {"temperature": 0.0},
            "n": 1,
            "spoken": "anthropic-messages",
            "call": 3,
            "session": 1,
            "parent": None,
            "relation": "starts",
            "model": "scripted",
            "endpoint": "http://127.0.0.1:9/v1",
            "completion": "hello",
            "finish_reason": "stop",
            "tool_calls": [],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}}],
            "usage": None,
            "cost": COST,
        },
    ),
    (
        "model_call",  # a program's call the policy server refused
        {
            "api": "completions",
            "via": "boundary",
            "policy_version": "base-v1",
            "prompt": "x" * 50,
            "sampling": {"max_tokens": 10},
            "n": 1,
            "dropped": ["best_of"],
            "call": 4,
            "rejected": "HTTP 400: the prompt is longer than the context window",
        },
    ),
    ("env_reset", {"observation": {"observation": "count 0", "objective": "reach 3"}}),
    (
        "env_step",
        {
            "index": 3,
            "action": "inc",
            "observation": {"observation": "count 3"},
            "reward": 1.0,
            "done": True,
            "truncated": False,
        },
    ),
    (
        "helper_call",
        {
            "name": "exec",
            "params": {"command": ["pytest", "-q"], "timeout_s": 30},
            "result": {"exit_code": 1, "timed_out": False, "stdout": "1 failed", "stderr": ""},
        },
    ),
    ("program_output", {"exit_code": -9, "stdout": "working…\n"}),
    ("program_output", {"exit_code": None, "stdout": ""}),
    ("log", {"message": "objective", "fields": {"objective": "reach 3"}}),
    ("log", {"message": "plain"}),
    (
        "harness_exception",
        {
            "error": "KeyError: 'x'",
            "traceback": 'Traceback (most recent call last):\n  File "agent.py", line 3\n',
            "frames": [
                {
                    "file": "agent.py",
                    "line": 3,
                    "function": "run",
                    "code": "return HINTS['x']",
                    "in_harness": True,
                }
            ],
        },
    ),
    ("answer", {"answer": {"nested": [1, "two", None]}}),
    ("answer", {"answer": None}),
    ("verdict", {"passed": True, "score": 1.0, "detail": "ok", "output": ""}),
    (
        "verdict",
        {"passed": False, "score": 0.33, "detail": "reached 1", "output": "", "counted": False},
    ),
    (
        "workspace_diff",
        {
            "files": [{"path": "app.py", "status": "modified", "diff": "--- a\n+++ b\n"}],
            "added": 0,
            "modified": 1,
            "deleted": 0,
            "truncated": False,
            "outside_app": {
                "added": 1,
                "changed": 0,
                "deleted": 0,
                "paths": ["added /tmp/x"],
                "tampered": [],
            },
        },
    ),
    ("workspace_diff", {"error": "the workspace holds more than 2000 files"}),
    (
        "environment",
        {
            "backend": "container",
            "harness": "container",
            "image": "coevo-task:abc",
            "image_cached": False,
            "network": "none",
            "cpus": None,
            "memory_bytes": None,
            "ready_s": 1.25,
            "build": {"seconds": 3.5, "content_hash": "abc", "log": "Step 1/2"},
        },
    ),
    (
        "environment",
        {
            "backend": "container",
            "build_failed": {
                "step": "RUN pip install x",
                "line": 3,
                "timed_out": False,
                "error": "exit 1",
                "log": "ERROR",
            },
        },
    ),
    ("error", {"outcome": "harness_error", "message": "the harness raised KeyError"}),
    (
        "error",
        {"outcome": "harness_error", "message": "limit exceeded", "stderr": "Traceback…"},
    ),
]

CLASSES = {
    StepKind.START: Start,
    StepKind.MODEL_CALL: ModelCall,
    StepKind.ENV_RESET: EnvReset,
    StepKind.ENV_STEP: EnvStep,
    StepKind.HELPER_CALL: HelperCall,
    StepKind.PROGRAM_OUTPUT: ProgramOutput,
    StepKind.LOG: Log,
    StepKind.HARNESS_EXCEPTION: HarnessException,
    StepKind.ANSWER: Answer,
    StepKind.VERDICT: Verdict,
    StepKind.WORKSPACE_DIFF: WorkspaceDiff,
    StepKind.ENVIRONMENT: Environment,
    StepKind.ERROR: Error,
}


def assert_reads_as_stored(
    kind: str, payload: dict[str, Any], *, ordered: bool = True
) -> TypedStep:
    """``payload`` parses to its kind's type, every key it holds is a declared field with the
    stored value, and it is written back key for key (``ordered``: in the writer's order too,
    as a compressed payload's JSON keeps it; a model call's two writers order keys apart)."""
    step = parse_step(kind, payload)
    assert type(step) is CLASSES[StepKind(kind)]
    assert step.extra == {}, f"{kind} keys no type declares: {sorted(step.extra)}"
    for key, value in payload.items():
        assert getattr(step, key) == value, key
    written = step.to_payload()
    assert written == payload
    if ordered and kind != StepKind.MODEL_CALL:
        assert list(written) == list(payload)
    return step


def test_it_names_every_kind_once_with_one_type_each():
    assert set(STEP_TYPES) == set(StepKind) == set(CLASSES)
    assert all(STEP_TYPES[kind] is cls for kind, cls in CLASSES.items())
    assert {kind for kind, _ in STORED_BEFORE_TYPES} == {str(kind) for kind in StepKind}


@pytest.mark.parametrize(("kind", "payload"), STORED_BEFORE_TYPES)
def test_it_reads_and_rewrites_each_stored_payload_unchanged(kind, payload):
    assert_reads_as_stored(kind, payload)


def test_it_writes_what_the_writers_wrote_before_the_types():
    assert Step.of(Answer(answer=42)).payload == {"answer": 42}
    assert Log(message="m").to_payload() == {"message": "m"}
    assert Error(outcome="harness_error", message="m").to_payload() == {
        "outcome": "harness_error",
        "message": "m",
    }
    # A code harness's start names its entrypoint, a program's its command; a workspace task's
    # says so, any other's does not.
    assert "command" not in Start(task="t", entrypoint="agent:run").to_payload()
    assert "workspace" not in Start(task="t", command=["python", "a.py"]).to_payload()
    assert Start(task="t", workspace=True).to_payload()["workspace"] is True
    # A scored verdict does not say it counted; an unscored one does.
    assert "counted" not in Verdict(passed=True, score=1.0).to_payload()
    assert Verdict(passed=False, counted=False).to_payload()["counted"] is False


def test_it_reads_a_payload_without_a_version_as_version_one():
    payload = {"message": "m", "fields": {"a": 1}}
    assert Log.from_payload({**payload, "v": 1}) == Log.from_payload(payload)
    assert "v" not in Log.from_payload(payload).to_payload()


def test_it_writes_the_version_of_a_changed_shape():
    @dataclass(frozen=True, kw_only=True)
    class LogV2(Log):
        VERSION: ClassVar[int] = 2
        level: str = "info"

    assert LogV2(message="m").to_payload() == {"message": "m", "level": "info", "v": 2}
    assert LogV2.from_payload({"message": "m", "level": "debug", "v": 2}).level == "debug"


def test_it_keeps_keys_it_does_not_declare_and_tolerates_missing_ones():
    odd = {"message": "m", "nested": {"k": [1, None]}}
    step = parse_step("log", odd)
    assert step.extra == {"nested": {"k": [1, None]}}
    assert step.to_payload() == odd
    assert parse_step("verdict", {"unstorable": "too deep"}).score is None
    assert parse_step("env_step", "not a dict") == EnvStep()


def test_it_names_a_declared_key_for_a_reader_in_the_database_and_refuses_others():
    assert ModelCall.key("session") == "session"
    for undeclared in ("sessions", "extra"):
        with pytest.raises(KeyError):
            ModelCall.key(undeclared)


def test_it_reads_a_kind_it_does_not_name_as_stored():
    assert parse_step("telemetry", {"x": 1}) == UnknownStep("telemetry", {"x": 1})


@pytest.fixture
def rollout(seed_candidate, humaneval_suite, policy_version) -> Rollout:
    evaluation = make_evaluation(
        candidate=seed_candidate,
        suite=humaneval_suite,
        policy_version=policy_version,
        state=EvaluationState.PENDING,
    )
    task = humaneval_suite.tasks.filter(split=Split.SEARCH).order_by("position").first()
    return Rollout.objects.create(
        evaluation=evaluation, task=task, seed=1, state=RolloutState.RUNNING, attempts=1
    )


def test_it_reads_stored_rows_of_today_through_the_types(rollout):
    huge = ("model_call", {**STORED_BEFORE_TYPES[2][1], "prompt": "p" * COMPRESS_OVER_BYTES})
    stored = [*STORED_BEFORE_TYPES, huge]
    with TraceWriter(rollout_id=rollout.id, attempt=1) as writer:
        for kind, payload in stored:
            writer.add(Step(kind, payload))

    page = trace_page(rollout=rollout, page_size=len(stored))

    assert [(row.kind, row.payload) for row in page.steps] == stored
    for row in page.steps:
        # PostgreSQL's jsonb orders an object's keys its own way.
        assert_reads_as_stored(row.kind, row.payload, ordered=False)


# --- what the worker records now ------------------------------------------------------------


def humaneval_run(tmp_path: Path, url: str, agent: str):
    """``agent`` (a code harness) on HumanEval/2, its ``ctx.check`` helper offered."""
    directory = tmp_path / "harness"
    directory.mkdir()
    (directory / "harness.toml").write_text(
        '[harness]\nname = "t"\nentrypoint = "agent:run"\npolicy_api = "completions"\n'
        "[limits]\nwall_time_s = 30\n"
    )
    (directory / "agent.py").write_text(textwrap.dedent(agent))
    environment = TaskEnvironment(
        adapter=humaneval.HumanEvalEnvironment(),
        inputs={"prompt": PROBLEM.prompt, "entry_point": PROBLEM.entry_point},
        verifier={"test": PROBLEM.test, "entry_point": PROBLEM.entry_point},
    )
    inputs = RolloutInputs(
        harness_dir=directory,
        task_key=PROBLEM.task_id,
        task_view=environment.adapter.harness_view(environment.inputs),
        knob_overrides={},
        seed=7,
        wall_time_s=60,
        policy_version="base-v1",
    )
    with PolicyClient(url, model="scripted", retries=1, backoff_s=0.01) as client:
        return execute_rollout(inputs, policy=client, environment=environment)


def test_a_rollout_records_steps_the_types_declare_key_for_key(scripted_policy, tmp_path):
    scripted_policy.rules.append(("def truncate_number", CORRECT))
    agent = """
        def run(task, ctx):
            reply = ctx.llm.complete(task["prompt"], max_tokens=64, n=2)
            ctx.log("drafted", samples=len(reply.texts))
            ctx.check(reply.texts[0])
            return reply.texts[0]
        """

    result = humaneval_run(tmp_path, scripted_policy.url, agent)

    assert result.outcome == RolloutOutcome.PASSED, result.detail
    assert [s.kind for s in result.steps] == [
        StepKind.START,
        StepKind.MODEL_CALL,
        StepKind.MODEL_CALL,
        StepKind.LOG,
        StepKind.HELPER_CALL,
        StepKind.ANSWER,
        StepKind.VERDICT,
    ]
    for step in result.steps:
        typed = assert_reads_as_stored(step.kind, step.payload)
        assert step.typed() == typed
    call = result.steps[1].typed()
    assert (call.api, call.sample, call.n, call.completion) == ("completions", 0, 2, CORRECT)
    assert result.steps[-1].typed().passed is True


def test_a_harness_that_raises_records_its_exception_and_error_as_declared(
    scripted_policy, tmp_path
):
    agent = """
        def run(task, ctx):
            return {}["missing"]
        """

    result = humaneval_run(tmp_path, scripted_policy.url, agent)

    assert result.outcome == RolloutOutcome.HARNESS_ERROR
    kinds = [s.kind for s in result.steps]
    assert kinds == [StepKind.START, StepKind.HARNESS_EXCEPTION, StepKind.ERROR]
    for step in result.steps:
        assert_reads_as_stored(step.kind, step.payload)
    raised = result.steps[1].typed()
    assert "KeyError" in raised.error
    assert any(frame["in_harness"] for frame in raised.frames)
    assert result.steps[2].typed().outcome == RolloutOutcome.HARNESS_ERROR


# --- no kind spelled outside the module ---------------------------------------------------

KIND_NAMES = "|".join(kind.value for kind in StepKind)
# A kind spelled as a string where a step's kind is compared, filtered or recorded.
SPELLED = re.compile(
    rf"""(\.kind\s*(==|!=)\s*|\bkind(__in)?=[\[(]?|Step\(|_pooled\(|kinds\.get\()["']({KIND_NAMES})["']"""
    rf"""|["']({KIND_NAMES})["']\s+(not\s+)?in\s+[\w.]*kinds"""
)


def test_no_step_kind_is_spelled_where_steps_are_read_or_written():
    sources = [
        path
        for top in ("coevo", "workers", "templates", "benchmarks")
        for path in (REPO / top).rglob("*")
        if path.suffix in (".py", ".html") and path != REPO / "workers" / "trace.py"
    ]
    spelled = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in sources
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if SPELLED.search(line)
    ]
    assert spelled == []


# The modules that read stored steps' payloads (pages, exports, proposers' workspaces, image
# builds): each parses a step through its type and reads its fields.
STEP_READERS = [
    "coevo/exports/records.py",
    "coevo/exports/conversation.py",
    "coevo/campaigns/workspace.py",
    "coevo/campaigns/proposers/agentic.py",
    "coevo/campaigns/patterns.py",
    "coevo/web/presenters.py",
    "coevo/web/trace_calls.py",
    "coevo/web/trace_tree.py",
    "coevo/web/trace_workspace.py",
    "coevo/evaluations/selectors.py",
    "coevo/suites/image_builds.py",
    "benchmarks/throughput.py",
]
KEY_READ = re.compile(r"""\bpayload(\.get\(|\[)|["']\w+["']\s+(not\s+)?in\s+payload\b""")


def test_readers_read_a_steps_keys_through_its_type():
    read = [
        f"{path}:{number}: {line.strip()}"
        for path in STEP_READERS
        for number, line in enumerate((REPO / path).read_text().splitlines(), 1)
        if KEY_READ.search(line)
    ]
    assert read == []


def test_templates_compare_kinds_the_module_names():
    used = {
        name
        for path in (REPO / "templates").rglob("*.html")
        for name in re.findall(r"\bkinds\.([A-Z_]+)\b", path.read_text())
    }
    assert used and used <= set(StepKind.__members__)
