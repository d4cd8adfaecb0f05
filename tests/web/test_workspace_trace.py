"""The rollout page on a workspace task's trace: each shell command the harness ran (the
``exec`` helper) with its exit code and output, the files it left as a diff and the hidden
tests' output, in a Workspace section above the steps (one query) and in the steps themselves,
and the held-out seal."""

from __future__ import annotations

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
from coevo.evaluations.traces import COMPRESS_OVER_BYTES, TraceWriter
from coevo.suites.models import Split, Task
from tests.support.factories import Step, make_evaluation, make_rollout
from tests.web.test_pages import text
from workers.outcomes import RolloutOutcome

pytestmark = pytest.mark.django_db

APP_DIFF = (
    "--- a/app.py\n"
    "+++ b/app.py\n"
    "@@ -1,2 +1,2 @@\n"
    " def add(a, b):\n"
    "-    return a - b  # OLD-LINE-MARKER\n"
    "+    return a + b  # NEW-LINE-MARKER\n"
)
TEST_OUTPUT = "tests/test_app.py::test_add PASSED\nTEST-OUTPUT-MARKER 1 passed in 0.01s\n"


def exec_step(command: str | list[str], *, exit_code: int | None = 0, **result: Any) -> Step:
    """A shell command as workers/environments/workspace.py's exec helper records it."""
    payload = {
        "name": "exec",
        "params": {"command": command},
        "result": {
            "exit_code": exit_code,
            "stdout": "",
            "stderr": "",
            "timed_out": False,
            "duration_ms": 1234,
            **result,
        },
    }
    return "helper_call", payload, {"latency_ms": 1240}


def diff_step(*files: dict[str, Any], truncated: bool = False) -> Step:
    counts = {s: sum(f["status"] == s for f in files) for s in ("added", "modified", "deleted")}
    return "workspace_diff", {"files": list(files), **counts, "truncated": truncated}, {}


def verdict_step(*, passed: bool = True, output: str = TEST_OUTPUT) -> Step:
    payload = {"passed": passed, "score": 1.0 if passed else 0.0, "detail": "1 passed"}
    return "verdict", payload | {"output": output}, {}


def start_step(task: Task) -> Step:
    payload = {"task": task.key, "knobs": {}, "command": ["python3", "agent.py"], "seed": 7}
    return "start", payload | {"workspace": True}, {}


def workspace_steps(task: Task) -> list[Step]:
    return [
        start_step(task),
        exec_step("cat app.py", stdout="def add(a, b):\n    return a - b\n"),
        exec_step(["grep", "-n", "two words", "app.py"], exit_code=1, stderr="GREP-STDERR-MARKER"),
        exec_step("sleep 100", exit_code=None, timed_out=True),
        exec_step("seq 1 30", stdout="".join(f"line-{n}\n" for n in range(1, 31))),
        ("answer", {"answer": None}, {}),
        diff_step(
            {"path": "app.py", "status": "modified", "diff": APP_DIFF},
            {
                "path": "NOTES.md",
                "status": "added",
                "diff": "--- /dev/null\n+++ b/NOTES.md\n@@ -0,0 +1 @@\n+ADDED-LINE-MARKER\n",
            },
            {"path": "logo.png", "status": "deleted", "note": "binary"},
        ),  # fmt: skip
        verdict_step(),
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
def workspace(evaluation, task) -> Rollout:
    return make_rollout(
        evaluation, task, outcome=RolloutOutcome.PASSED, score=1.0, steps=workspace_steps(task)
    )


def url(project, rollout, **query) -> str:
    base = reverse("web:rollout", args=[project.slug, rollout.id])
    return base + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")


def step_html(page: str, step_id: str) -> str:
    match = re.search(rf'<li class="step [^"]*" id="step-{step_id}">(.*?)\n</li>', page, re.S)
    assert match, f"no step {step_id}"
    return match[1]


def section_html(page: str) -> str:
    """The Workspace section: from its start to the task prompt's section, next on the page."""
    match = re.search(r'<section id="workspace">(.*?)<h2>Task prompt</h2>', page, re.S)
    assert match, "no Workspace section"
    return match[1]


def words(html_text: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html_text).split())


def test_it_shows_a_command_with_its_exit_code_duration_and_output(
    client, owner, project, workspace
):
    client.force_login(owner)
    page = text(client.get(url(project, workspace)))
    cat = step_html(page, "1-1")
    assert "$ cat app.py" in words(cat)
    assert '<span class="badge pass exit-code">exit 0</span>' in cat
    assert "1,234 ms" in cat
    assert "<h4>stdout</h4>" in cat and "    return a - b\n" in cat
    assert "ctx.helper" not in cat  # not the generic helper rendering
    grep = step_html(page, "1-2")
    assert "$ grep -n 'two words' app.py" in words(grep)  # an argv list, shell-quoted
    assert '<span class="badge fail exit-code">exit 1</span>' in grep
    assert '<pre class="block stderr">GREP-STDERR-MARKER</pre>' in grep
    assert ">timed out</span>" in step_html(page, "1-3")


def test_it_collapses_an_output_longer_than_twenty_lines(client, owner, project, workspace):
    client.force_login(owner)
    seq = step_html(text(client.get(url(project, workspace))), "1-4")
    assert '<details class="exec-output"><summary>stdout (30 lines)</summary>' in seq
    assert "line-30" in seq


def test_it_keeps_other_helpers_as_they_were(client, owner, project, evaluation, task):
    lookup = ("helper_call", {"name": "lookup", "params": {"q": "x"}, "result": {"hit": 1}}, {})
    rollout = make_rollout(evaluation, task, outcome=RolloutOutcome.PASSED, steps=[lookup])
    client.force_login(owner)
    step = step_html(text(client.get(url(project, rollout))), "1-0")
    assert 'ctx.helper("lookup")' in step and "exit-code" not in step


def test_it_shows_the_final_diff_and_the_test_output_above_the_steps(
    client, owner, project, workspace
):
    client.force_login(owner)
    page = text(client.get(url(project, workspace)))
    assert page.index('id="workspace"') < page.index('id="trace-steps"')
    section = section_html(page)
    shown = words(section)
    assert "3 files changed: 1 added, 1 modified, 1 deleted" in shown
    assert "modified app.py +1 −1" in shown and "added NOTES.md +1 −0" in shown
    assert "deleted logo.png" in shown and "binary" in shown
    assert "OLD-LINE-MARKER" in section and "NEW-LINE-MARKER" in section
    assert "ADDED-LINE-MARKER" in section
    # The diff page's highlighting: an added line is a Pygments "gi" (inserted) token.
    assert re.search(r'<span class="gi">\+    return a \+ b  # NEW-LINE-MARKER', section)
    assert "passed score 1.0 · 1 passed" in shown
    assert "<h4>Test output</h4>" in section and "TEST-OUTPUT-MARKER 1 passed" in section
    # And in the trace: the diff step and the verdict's test output.
    assert "NEW-LINE-MARKER" in step_html(page, "1-6")
    assert "<h4>Test output</h4>" in step_html(page, "1-7")


def test_it_escapes_file_names_and_diff_lines(client, owner, project, evaluation, task):
    diff = "--- /dev/null\n+++ b/<b>.py\n@@ -0,0 +1 @@\n+print('<script>alert(1)</script>')\n"
    steps = [
        diff_step({"path": "<b>.py", "status": "added", "diff": diff}),
        diff_step({"path": "<i>.bin", "status": "added", "note": "binary <em>"}),
    ]
    rollout = make_rollout(evaluation, task, outcome=RolloutOutcome.TASK_FAILURE, steps=steps)
    client.force_login(owner)
    raw = client.get(url(project, rollout)).content.decode()
    assert "&lt;b&gt;.py" in raw and "<b>.py" not in raw
    assert "&lt;i&gt;.bin" in raw and "<i>.bin" not in raw
    assert "binary &lt;em&gt;" in raw and "binary <em>" not in raw
    assert "<script>alert(1)" not in raw


def test_it_renders_a_large_diff_as_far_as_its_payload_keeps_it(
    client, owner, project, evaluation, task
):
    """Written through the TraceWriter, as the worker does: a diff over the compression bound
    is stored compressed; the page shows it whole, and a file past the worker's size bound
    only by name and note."""
    rollout = Rollout.objects.create(
        evaluation=evaluation, task=task, seed=1, state=RolloutState.RUNNING, attempts=1
    )
    body = "".join(f"+big line {n}\n" for n in range(COMPRESS_OVER_BYTES // 10))
    big = f"--- /dev/null\n+++ b/big.txt\n@@ -0,0 +1,{COMPRESS_OVER_BYTES // 10} @@\n{body}"
    cut = "the diff is over the size kept with a rollout"
    steps = [
        diff_step(
            {"path": "big.txt", "status": "added", "diff": big + "+LAST-BIG-LINE\n"},
            {"path": "zz-cut.txt", "status": "added", "note": cut},
            truncated=True,
        ),
        verdict_step(passed=False),
    ]

    class _Step:
        def __init__(self, kind, payload, extra):
            self.kind, self.payload = kind, payload
            self.prompt_tokens = self.completion_tokens = 0
            self.latency_ms = extra.get("latency_ms", 0)

    with TraceWriter(rollout_id=rollout.id, attempt=1) as writer:
        for step in steps:
            writer.add(_Step(*step))
    assert TraceStep.objects.get(rollout=rollout, kind="workspace_diff").payload_zlib is not None
    client.force_login(owner)
    page = text(client.get(url(project, rollout)))
    section = section_html(page)
    assert "LAST-BIG-LINE" in section  # the whole payload, not its stored excerpt
    assert "The diff was cut at the size kept with a rollout" in section
    files = re.findall(r'<section class="diff-file workspace-file">(.*?)</section>', section, re.S)
    assert len(files) == 2
    assert "zz-cut.txt" in files[1] and cut in files[1] and 'class="code diff"' not in files[1]
    assert section.count('class="code diff"') == 1


def test_it_shows_a_workspace_over_its_limits_as_an_error(client, owner, project, evaluation, task):
    steps = [("workspace_diff", {"error": "the workspace holds more than 2000 files"}, {})]
    rollout = make_rollout(evaluation, task, outcome=RolloutOutcome.HARNESS_ERROR, steps=steps)
    client.force_login(owner)
    page = text(client.get(url(project, rollout)))
    assert "No diff of the workspace: the workspace holds more than 2000 files" in words(
        section_html(page)
    )
    assert "The hidden tests did not run" in section_html(page)
    assert "workspace-error" in step_html(page, "1-0")


def test_it_shows_the_last_attempts_workspace(client, owner, project, evaluation, task):
    rollout = make_rollout(
        evaluation, task, outcome=RolloutOutcome.PASSED, steps=workspace_steps(task)
    )
    second = diff_step({"path": "SECOND-ATTEMPT.py", "status": "added", "diff": "+x\n"})
    TraceStep.objects.create(rollout=rollout, attempt=2, index=0, kind=second[0], payload=second[1])
    client.force_login(owner)
    section = section_html(text(client.get(url(project, rollout))))
    assert "SECOND-ATTEMPT.py" in section and "app.py" not in section
    assert "(attempt 2)" in words(section) and "The hidden tests did not run" in section


def tracestep_queries(client, address: str, headers: dict[str, str] | None = None) -> list[str]:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(address, headers=headers)
    assert response.status_code == 200
    return [q["sql"] for q in queries.captured_queries if "tracestep" in q["sql"].lower()]


def test_it_reads_the_workspace_in_one_query_and_not_for_the_next_steps(
    client, owner, project, workspace
):
    client.force_login(owner)
    queries = tracestep_queries(client, url(project, workspace))
    # The page, the two summary aggregates, and the workspace's diff and verdict.
    assert len(queries) == 4, queries
    (workspace_query,) = [sql for sql in queries if "'workspace_diff'" in sql]
    assert "'verdict'" in workspace_query and "LIMIT 2" in workspace_query
    # htmx's "load more" gets steps only: the section is already on the page.
    htmx = {"HX-Request": "true"}
    partial = tracestep_queries(client, url(project, workspace, **{"from": "1.0"}), htmx)
    assert len(partial) == 4 and not [sql for sql in partial if "'workspace_diff'" in sql]
    assert 'id="workspace"' not in text(client.get(url(project, workspace), headers=htmx))


def test_it_keeps_a_held_out_workspace_rollout_sealed(
    client, researcher, project, seed_candidate, humaneval_suite, policy_version
):
    task = Task.objects.filter(suite=humaneval_suite, split=Split.HELDOUT).first()
    evaluation = make_evaluation(
        candidate=seed_candidate,
        suite=humaneval_suite,
        policy_version=policy_version,
        split=Split.HELDOUT,
    )
    rollout = make_rollout(
        evaluation, task, outcome=RolloutOutcome.PASSED, steps=workspace_steps(task)
    )
    client.force_login(researcher)
    for response in (
        client.get(url(project, rollout)),
        client.get(url(project, rollout), headers={"HX-Request": "true"}),
    ):
        assert response.status_code == 404
        body = text(response)
        assert "NEW-LINE-MARKER" not in body and "TEST-OUTPUT-MARKER" not in body
        assert "cat app.py" not in body and 'id="workspace"' not in body
