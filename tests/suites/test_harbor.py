"""Workspace suites from Harbor task directories: what is taken, what is refused and why."""

from __future__ import annotations

import base64
import os
import time
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from coevo.audit.models import AuditEvent
from coevo.suites import harbor
from coevo.suites.harbor import suite_import_harbor
from coevo.suites.harbor_tasks import DEFAULT_VERIFIER_TIMEOUT_S
from coevo.suites.jsonl import SuiteImportError
from coevo.suites.models import Suite, SuiteKind, Task
from coevo.suites.splits import split_for
from tests.support.factories import make_jsonl_suite
from tests.support.harbor import (
    SOLVE_41,
    SOLVE_42,
    TEST_SH,
    write_harbor_task,
)

pytestmark = pytest.mark.django_db


def imported(project, directory, **options):
    return suite_import_harbor(project=project, name="tasks", directory=directory, **options)


def refusals(report) -> dict[str, str]:
    return dict(report.refused)


def warnings_of(report, key: str) -> list[str]:
    return [text for task, text in report.warnings if task == key]


# --- what is taken --------------------------------------------------------------------------


def test_it_takes_the_files_a_files_only_dockerfile_copies_into_app(project, tmp_path):
    write_harbor_task(
        tmp_path,
        "fix-it",
        dockerfile=(
            "# syntax=docker/dockerfile:1\n"
            "FROM python:3.12-slim\n"
            "WORKDIR /app\n"
            "# the package, then the entry points\n"
            "COPY src/ /app/src/\n"
            "COPY main.py \\\n"
            "     # a comment inside a continuation\n"
            "     requirements.txt ./\n"
            "COPY --chmod=755 run.sh /app/bin/\n"
            "ADD data.bin data/\n"
            "ENV PYTHONPATH=/app\n"
            'CMD ["python", "main.py"]\n'
        ),
        environment={
            "src/a.py": "A = 1\n",
            "src/pkg/b.py": "B = 2\n",
            "main.py": "print('hi')\n",
            "requirements.txt": "pytest\n",
            "run.sh": "#!/bin/sh\n",
            "notes.txt": "not copied\n",
        },
        task_toml=(
            '[task]\nname = "org/fix-it"\nkeywords = ["python"]\n'
            '[metadata]\ndifficulty = "easy"\ncreated = 2025-01-02\n'
            "[agent]\ntimeout_sec = 300\n[verifier]\ntimeout_sec = 45.5\n"
            "[environment]\ncpus = 2\nmemory_mb = 2048\n"
        ),
        tests={"test.sh": TEST_SH, "test_it.py": "def test(): pass\n"},
    )
    (tmp_path / "fix-it" / "environment" / "data.bin").write_bytes(b"\xff\x00\xfe")

    suite, created, report = imported(project, tmp_path)

    assert created and suite.kind == SuiteKind.WORKSPACE and suite.version == "v1"
    assert report.taken == ["fix-it"] and report.refused == []
    task = suite.tasks.get()
    files = task.inputs["files"]
    assert sorted(files) == [
        "bin/run.sh",
        "data/data.bin",
        "main.py",
        "requirements.txt",
        "src/a.py",
        "src/pkg/b.py",
    ]
    assert files["src/pkg/b.py"] == {"text": "B = 2\n"}
    assert files["bin/run.sh"] == {"text": "#!/bin/sh\n", "executable": True}
    assert base64.b64decode(files["data/data.bin"]["base64"]) == b"\xff\x00\xfe"
    assert task.inputs["instruction"] == "Write the answer to /app/answer.txt.\n"
    assert task.inputs["metadata"] == {
        "name": "org/fix-it",
        "keywords": ["python"],
        "difficulty": "easy",
        "created": "2025-01-02",
    }
    assert task.inputs["agent_timeout_s"] == 300.0
    assert task.verifier["timeout_s"] == 45.5
    assert sorted(task.verifier["tests"]) == ["test.sh", "test_it.py"]
    assert task.verifier["solution"] == {}
    assert task.split == split_for("fix-it", seed="0")
    notes = warnings_of(report, "fix-it")
    assert any("environment.cpus, environment.memory_mb" in n for n in notes), notes
    assert any("ignored" in n and "ENV PYTHONPATH=/app" in n and "CMD" in n for n in notes)
    assert AuditEvent.objects.filter(action="suite.imported").count() == 1


def test_it_applies_dockerignore_and_globs_as_docker_build_does(project, tmp_path):
    write_harbor_task(
        tmp_path,
        "ignore",
        dockerfile="FROM scratch\nWORKDIR /app\nCOPY . .\nCOPY *.txt docs/\n",
        environment={
            ".dockerignore": "**/__pycache__\nsecret*\n!secret-ok.txt\nREADME.md\n",
            "keep.py": "x\n",
            "pkg/__pycache__/x.pyc": "junk",
            "secret.txt": "s\n",
            "secret-ok.txt": "ok\n",
            "README.md": "readme\n",
        },
    )

    suite, _, _ = imported(project, tmp_path)

    files = suite.tasks.get().inputs["files"]
    # COPY . copies the Dockerfile and .dockerignore too, as docker does.
    assert sorted(files) == [
        ".dockerignore",
        "Dockerfile",
        "docs/secret-ok.txt",
        "keep.py",
        "secret-ok.txt",
    ]


def test_it_starts_from_an_empty_workspace_without_environment(project, tmp_path):
    write_harbor_task(tmp_path, "bare", dockerfile=None, environment={})

    suite, _, report = imported(project, tmp_path)

    assert suite.tasks.get().inputs["files"] == {}
    assert warnings_of(report, "bare") == ["no environment/: the task starts from an empty /app"]


def test_it_takes_a_single_task_directory_under_its_own_name(project, tmp_path):
    task_dir = write_harbor_task(tmp_path, "only-one", solve_sh=SOLVE_42)

    suite, _, report = imported(project, task_dir)

    assert report.taken == ["only-one"]
    assert suite.tasks.get().verifier["solution"]["solve.sh"] == {"text": SOLVE_42}
    assert suite.tasks.get().verifier["timeout_s"] == 30.0


def test_it_defaults_the_verifier_timeout(project, tmp_path):
    write_harbor_task(tmp_path, "t", task_toml='version = "1.0"\n')

    suite, _, _ = imported(project, tmp_path)

    task = suite.tasks.get()
    assert task.verifier["timeout_s"] == DEFAULT_VERIFIER_TIMEOUT_S
    assert task.inputs["agent_timeout_s"] is None and task.inputs["metadata"] == {}


# --- what is refused ------------------------------------------------------------------------


RUN_DOCKERFILE = (
    "FROM python:3.12-slim\n"
    "RUN apt-get update && \\\n"
    "    apt-get install -y git\n"
    "WORKDIR /app\n"
    "COPY answer.txt /app/answer.txt\n"
    "RUN pip install pytest\n"
)


def test_it_refuses_a_dockerfile_that_runs_commands_unless_allowed(project, tmp_path, settings):
    settings.COEVO_CONTAINER_BACKEND = False
    write_harbor_task(tmp_path, "needs-image", dockerfile=RUN_DOCKERFILE)
    write_harbor_task(tmp_path, "plain")

    suite, _, report = imported(project, tmp_path)

    assert report.taken == ["plain"]
    reason = refusals(report)["needs-image"]
    assert reason.startswith(
        "environment/Dockerfile runs `RUN apt-get update && apt-get install -y git` "
        "(and 1 more instruction of the kind): the task needs its container, which the bwrap "
        "sandbox cannot build; set COEVO_CONTAINER_BACKEND=1 on the web process and the workers "
        '(docs/deployment.md, "The container backend") to import it as it is, or pass '
        "--allow-dockerfile"
    ), reason
    assert list(suite.tasks.values_list("key", flat=True)) == ["plain"]

    allowed, created, report = imported(project, tmp_path, allow_dockerfile=True)

    assert created and allowed.version == "v2"
    assert report.taken == ["needs-image", "plain"] and report.refused == []
    task = allowed.tasks.get(key="needs-image")
    assert task.inputs["files"] == {"answer.txt": {"text": "0\n"}}
    (warning,) = [w for w in warnings_of(report, "needs-image") if "skipped" in w]
    assert "RUN apt-get update && apt-get install -y git, RUN pip install pytest" in warning


@pytest.mark.parametrize(
    ("dockerfile", "expected"),
    [
        ("FROM a AS build\nFROM b\nCOPY --from=build /x /app/\n", "has `FROM b`"),
        ("FROM a\nWORKDIR /app\nCOPY --from=build /x /app/\n", "has `COPY --from=build /x /app/`"),
        ("FROM a\nCOPY answer.txt /etc/answer.txt\n", "has `COPY answer.txt /etc/answer.txt`"),
        ("FROM a\nWORKDIR /src\nCOPY . .\n", "has `WORKDIR /src`"),
        ("FROM a\nADD https://x.test/f /app/\n", "has `ADD https://x.test/f /app/`"),
        ("FROM a\nCOPY <<EOF /app/f\nhello\nEOF\n", "has `COPY <<EOF /app/f`"),
        ("FROM a\nVOLUME /data\n", "has `VOLUME /data`"),
    ],
)
def test_it_counts_what_is_not_a_copy_into_app_as_needing_the_container(
    project, tmp_path, settings, dockerfile, expected
):
    settings.COEVO_CONTAINER_BACKEND = False
    write_harbor_task(tmp_path, "t", dockerfile=dockerfile)
    write_harbor_task(tmp_path, "ok")

    _, _, report = imported(project, tmp_path)

    assert f"environment/Dockerfile {expected}" in refusals(report)["t"]


def test_it_refuses_a_compose_file_or_a_prebuilt_image_unless_allowed(project, tmp_path, settings):
    settings.COEVO_CONTAINER_BACKEND = False
    write_harbor_task(tmp_path, "compose", dockerfile=None, environment={"docker-compose.yaml": ""})
    write_harbor_task(
        tmp_path, "image", task_toml='[environment]\ndocker_image = "ghcr.io/x/y:1"\n'
    )
    write_harbor_task(tmp_path, "ok")

    _, _, report = imported(project, tmp_path)

    assert refusals(report)["compose"].startswith(
        "environment/docker-compose.yaml defines the task's containers"
    )
    assert "docker_image = 'ghcr.io/x/y:1'" in refusals(report)["image"]

    _, _, report = imported(project, tmp_path, allow_dockerfile=True)

    assert report.taken == ["compose", "image", "ok"]


def test_it_refuses_a_task_without_test_sh(project, tmp_path):
    write_harbor_task(tmp_path, "no-test", tests={"test_it.py": "def test(): pass\n"})
    write_harbor_task(tmp_path, "no-tests-dir", tests=None)
    write_harbor_task(tmp_path, "ok")

    _, _, report = imported(project, tmp_path)

    assert refusals(report) == {
        "no-test": "tests/test.sh is missing: it runs the tests and writes the reward",
        "no-tests-dir": "tests/ is missing: it holds test.sh, which runs the tests and writes "
        "the reward",
    }


def test_it_refuses_a_bad_task_toml_naming_the_task(project, tmp_path):
    write_harbor_task(tmp_path, "broken", task_toml="[verifier\ntimeout_sec = 1\n")

    with pytest.raises(SuiteImportError) as raised:
        imported(project, tmp_path)

    assert raised.value.errors[0].startswith("broken: task.toml is not valid TOML: ")
    assert "line 1" in raised.value.errors[0]
    assert not Suite.objects.exists()


@pytest.mark.parametrize(
    ("task_toml", "reason"),
    [
        ("[agent]\ntimeout_sec = 'soon'\n", "[agent] timeout_sec must be a number of seconds"),
        ("[verifier]\ntimeout_sec = -1\n", "[verifier] timeout_sec must be above 0, got -1"),
        ("metadata = 3\n", "[metadata] must be a table"),
        ("[[steps]]\nname = 'a'\n", "multi-step tasks are not supported"),
        ("x" * (65 * 1024), "task.toml is 66560 bytes, over the 64 KiB limit"),
    ],
)
def test_it_refuses_task_toml_values_it_cannot_apply(project, tmp_path, task_toml, reason):
    write_harbor_task(tmp_path, "t", task_toml=task_toml)
    write_harbor_task(tmp_path, "ok")

    _, _, report = imported(project, tmp_path)

    assert reason in refusals(report)["t"]


def test_it_refuses_a_copy_from_outside_the_build_context(project, tmp_path):
    write_harbor_task(tmp_path, "escape", dockerfile="FROM a\nCOPY ../tests/test.sh /app/\n")
    write_harbor_task(tmp_path, "absolute", dockerfile="FROM a\nCOPY /etc/passwd /app/\n")
    write_harbor_task(tmp_path, "dest", dockerfile="FROM a\nCOPY answer.txt /app/../etc/x\n")
    write_harbor_task(tmp_path, "ok")

    _, _, report = imported(project, tmp_path, allow_dockerfile=True)

    reasons = refusals(report)
    assert reasons["escape"] == (
        "environment/Dockerfile: line 2: the source '../tests/test.sh' is outside the build "
        "context (environment/); copy files from inside it"
    )
    assert "outside the build context" in reasons["absolute"]
    assert "the destination '/app/../etc/x' has a '..' part" in reasons["dest"]


def test_it_refuses_env_lines_that_double_a_value_naming_the_limit(project, tmp_path):
    # Each ENV line doubles the one before: 11 make 128 KiB (line 14); 40 asked for 64 TiB.
    doubling = "".join(f"ENV V{n}=$V{n - 1}$V{n - 1}\n" for n in range(1, 12))
    dockerfile = f"FROM a\nWORKDIR /app\nENV V0={'x' * 64}\n{doubling}COPY answer.txt /app/\n"
    write_harbor_task(tmp_path, "doubling", dockerfile=dockerfile)
    write_harbor_task(tmp_path, "ok")

    _, _, report = imported(project, tmp_path)

    assert report.taken == ["ok"]
    assert refusals(report)["doubling"].startswith(
        "environment/Dockerfile: line 14: its variables expand to 131072 characters, over the "
        "64 KiB limit on one expanded value"
    )


def test_it_refuses_a_dockerignore_pattern_over_its_bounds_naming_the_line(project, tmp_path):
    write_harbor_task(
        tmp_path,
        "stars",
        dockerfile="FROM a\nCOPY . /app/\n",
        environment={"answer.txt": "0\n", ".dockerignore": "*.pyc\n" + "**a" * 40 + "\n"},
    )
    write_harbor_task(tmp_path, "ok")

    _, _, report = imported(project, tmp_path)

    assert report.taken == ["ok"]
    reason = refusals(report)["stars"]
    assert reason.startswith("environment/.dockerignore: line 2: the pattern '**a**a"), reason
    assert "has 40 wildcards (*, **, ?, [...]), over the limit of 8" in reason


def test_it_refuses_symbolic_links(project, tmp_path):
    write_harbor_task(tmp_path, "linked-test")
    os.symlink("/etc/passwd", tmp_path / "linked-test" / "tests" / "data.txt")
    write_harbor_task(tmp_path, "linked-source", dockerfile="FROM a\nWORKDIR /app\nCOPY . .\n")
    os.symlink("/etc/passwd", tmp_path / "linked-source" / "environment" / "passwd")
    write_harbor_task(tmp_path, "ok")
    os.symlink(tmp_path / "ok", tmp_path / "linked-dir")

    _, _, report = imported(project, tmp_path)

    reasons = refusals(report)
    assert reasons["linked-test"] == (
        "tests/: data.txt is a symbolic link; only plain files are taken"
    )
    assert reasons["linked-source"] == (
        "environment/passwd is a symbolic link; only plain files are taken"
    )
    assert reasons["linked-dir"].startswith("the task directory is a symbolic link")


def test_it_refuses_task_directories_whose_names_are_not_keys(project, tmp_path):
    write_harbor_task(tmp_path, "Has Spaces")
    write_harbor_task(tmp_path, "ok")
    (tmp_path / "README.md").write_text("not a task\n")
    (tmp_path / ".git").mkdir()

    _, _, report = imported(project, tmp_path)

    assert report.taken == ["ok"]
    assert list(refusals(report)) == ["Has Spaces"]
    assert "not a usable task key" in refusals(report)["Has Spaces"]


def test_it_refuses_an_import_whose_every_task_is_refused(project, tmp_path):
    write_harbor_task(tmp_path, "a", tests=None)
    write_harbor_task(tmp_path, "b", dockerfile=RUN_DOCKERFILE)

    with pytest.raises(SuiteImportError) as raised:
        imported(project, tmp_path)

    assert [e.split(":")[0] for e in raised.value.errors] == ["a", "b"]
    assert not Suite.objects.exists()


def test_it_refuses_more_tasks_than_the_limit(project, tmp_path, monkeypatch):
    monkeypatch.setattr(harbor, "MAX_TASKS", 2)
    for key in ("a", "b", "c"):
        write_harbor_task(tmp_path, key)

    with pytest.raises(SuiteImportError, match="more than 2 task directories"):
        imported(project, tmp_path)


def test_it_refuses_a_suite_over_its_size_limit(project, tmp_path, monkeypatch):
    monkeypatch.setattr(harbor, "MAX_SUITE_BYTES", 150)
    for key in ("a", "b", "c"):
        write_harbor_task(tmp_path, key)

    with pytest.raises(SuiteImportError, match=r"files and text \(reached at a\)"):
        imported(project, tmp_path)


def test_it_refuses_a_name_another_kind_of_suite_holds(project, tmp_path):
    make_jsonl_suite(project, [{"id": "a", "input": "x", "expected": "y"}], name="tasks")
    write_harbor_task(tmp_path, "ok")

    with pytest.raises(SuiteImportError, match="already has a custom \\(JSONL\\) suite named"):
        imported(project, tmp_path)


# --- identity -------------------------------------------------------------------------------


def test_it_returns_the_same_suite_for_the_same_tasks_and_seed(project, tmp_path):
    write_harbor_task(tmp_path, "a")
    write_harbor_task(tmp_path, "b", dockerfile=RUN_DOCKERFILE)
    first, created, _ = imported(project, tmp_path)

    again, created_again, report = imported(project, tmp_path)

    assert created and not created_again and again == first
    assert report.taken == ["a"] and list(refusals(report)) == ["b"]
    (tmp_path / "a" / "instruction.md").write_text("Something else.\n")
    changed, created_changed, _ = imported(project, tmp_path)
    assert created_changed and changed.version == "v2"
    assert changed.content_hash != first.content_hash


def test_it_makes_another_suite_for_another_split_seed(project, tmp_path):
    for key in ("a", "b", "c", "d"):
        write_harbor_task(tmp_path, key)
    first, _, _ = imported(project, tmp_path)

    other, created, _ = imported(project, tmp_path, split_seed="7")

    assert created and other != first and other.version == "v2"
    assert other.content_hash == first.content_hash and other.split_seed == "7"
    assert {t.key: t.split for t in other.tasks.all()} == {
        key: split_for(key, seed="7") for key in ("a", "b", "c", "d")
    }


# --- solutions (the real sandbox) ---------------------------------------------------------------


def test_it_checks_solutions_in_the_sandbox_and_refuses_the_ones_that_fail(project, tmp_path):
    write_harbor_task(tmp_path, "good", solve_sh=SOLVE_42)
    write_harbor_task(tmp_path, "bad", solve_sh=SOLVE_41)
    write_harbor_task(
        tmp_path, "done-already", environment={"answer.txt": "42\n"}, solve_sh=SOLVE_42
    )
    write_harbor_task(tmp_path, "unsolved")
    seen = []

    suite, _, report = imported(
        project,
        tmp_path,
        check_solutions=True,
        progress=lambda done, total, key: seen.append((done, total, key)),
    )

    assert report.taken == ["done-already", "good", "unsolved"]
    reason = refusals(report)["bad"]
    assert reason.startswith(
        "its solution does not pass its tests: the hidden tests failed (reward 0); "
        "the output ends:\n"
    ), reason
    assert "answer.txt says 41" in reason
    assert "already pass its tests" in warnings_of(report, "done-already")[-1]
    assert warnings_of(report, "unsolved")[-1] == "no solution/solve.sh: its tests were not checked"
    assert seen == [(1, 3, "bad"), (2, 3, "done-already"), (3, 3, "good")]
    assert sorted(Task.objects.filter(suite=suite).values_list("key", flat=True)) == [
        "done-already",
        "good",
        "unsolved",
    ]


def test_a_solution_gets_no_more_time_than_a_harness_whatever_its_task_asks(
    project, tmp_path, settings
):
    """A task's own ``[agent] timeout_sec`` is the importer's input: it used to run solve.sh for
    as long as it said (a day, say)."""
    settings.COEVO_ROLLOUT_WALL_S = 2
    write_harbor_task(
        tmp_path,
        "slow",
        task_toml="[agent]\ntimeout_sec = 86400\n",
        solve_sh="#!/bin/bash\nsleep 20\necho 42 > /app/answer.txt\n",
    )
    write_harbor_task(tmp_path, "quick", solve_sh=SOLVE_42)
    started = time.monotonic()

    _, _, report = imported(project, tmp_path, check_solutions=True)

    assert time.monotonic() - started < 15
    assert report.taken == ["quick"]
    assert refusals(report)["slow"].startswith(
        "its solution does not pass its tests: solve.sh timed out"
    ), report.refused


# --- the command line -----------------------------------------------------------------------


def run_command(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("suite_import", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_the_command_imports_a_directory_and_prints_the_report(project, tmp_path):
    write_harbor_task(tmp_path, "good", solve_sh=SOLVE_42)
    write_harbor_task(tmp_path, "bad", solve_sh=SOLVE_41)
    write_harbor_task(tmp_path, "needs-image", dockerfile=RUN_DOCKERFILE)

    out, _ = run_command(
        "--project", project.slug, "harbor", str(tmp_path), "--name", "mine", "--check-solutions"
    )

    suite = Suite.objects.get(name="mine")
    assert suite.kind == SuiteKind.WORKSPACE
    assert "  checked 1/2: bad\n  checked 2/2: good\n" in out
    assert "tasks taken: 1, refused 2\n" in out
    assert "  refused bad: its solution does not pass its tests" in out
    assert "  refused needs-image: environment/Dockerfile runs `RUN apt-get update" in out
    assert "mine v1 (workspace (Harbor tasks)): imported as a new suite" in out


def test_the_command_lists_every_refusal_when_nothing_is_taken(project, tmp_path):
    write_harbor_task(tmp_path, "a", tests=None)

    with pytest.raises(CommandError, match="The suite was not imported: 1 error"):
        run_command("--project", project.slug, "harbor", str(tmp_path), "--name", "mine")


def test_the_workspace_importer_imports_the_shipped_directory(project, tmp_path, monkeypatch):
    write_harbor_task(tmp_path, "shipped")
    monkeypatch.setattr(harbor, "WORKSPACE_DATA_DIR", tmp_path)

    out, _ = run_command("--project", project.slug, "workspace", "--split-seed", "3")

    suite = Suite.objects.get(name="workspace-basic")
    assert suite.split_seed == "3" and suite.kind == SuiteKind.WORKSPACE
    assert "tasks taken: 1\n" in out
