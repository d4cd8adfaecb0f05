"""Importing custom suites: versions by content, deterministic splits, immutability once used."""

from __future__ import annotations

import json

import pytest
from django.db.models import ProtectedError

from coevo.evaluations.models import EvaluationState
from coevo.suites.jsonl import ScorerSpec, SuiteImportError, scorer_spec_build
from coevo.suites.models import Split, Suite, SuiteInUse, SuiteKind, Task
from coevo.suites.services import suite_delete, suite_import_humaneval, suite_import_jsonl
from coevo.suites.splits import split_for
from tests.support.factories import make_evaluation

pytestmark = pytest.mark.django_db

EXACT = ScorerSpec(kind="exact")


def suite_file(n: int = 20, *, answer: str = "yes", **extra) -> bytes:
    rows = [
        {"id": f"q{i}", "input": f"question {i}", "expected": answer, **extra} for i in range(n)
    ]
    return "\n".join(json.dumps(r) for r in rows).encode()


def test_it_imports_tasks_with_inputs_for_the_harness_and_the_reference_for_the_worker(project):
    suite, created = suite_import_jsonl(
        project=project, name="qa", data=suite_file(3), scorer=EXACT, description=" Q&A "
    )

    assert created
    assert (suite.kind, suite.version, suite.description) == (SuiteKind.JSONL, "v1", "Q&A")
    assert suite.scorer == {"kind": "exact"}
    task = suite.tasks.get(key="q1")
    assert task.inputs == {"input": "question 1", "metadata": {}}
    assert task.verifier == {"scorer": {"kind": "exact"}, "expected": "yes"}
    assert list(suite.tasks.values_list("key", flat=True)) == ["q0", "q1", "q2"]


def test_it_returns_the_existing_suite_when_the_same_content_is_imported_again(project):
    first, _ = suite_import_jsonl(project=project, name="qa", data=suite_file(), scorer=EXACT)
    reformatted = b"\n".join(
        json.dumps(json.loads(line), indent=None, separators=(",", ":")).encode()
        for line in suite_file().splitlines()
    )

    again, created = suite_import_jsonl(project=project, name="qa", data=reformatted, scorer=EXACT)

    assert (again.id, created) == (first.id, False)
    assert Suite.objects.filter(project=project, name="qa").count() == 1


def test_it_makes_a_changed_file_a_new_version_and_leaves_the_old_one_as_it_was(project):
    v1, _ = suite_import_jsonl(project=project, name="qa", data=suite_file(), scorer=EXACT)

    v2, created = suite_import_jsonl(
        project=project, name="qa", data=suite_file(answer="no"), scorer=EXACT
    )
    v3, _ = suite_import_jsonl(
        project=project, name="qa", data=suite_file(), scorer=ScorerSpec(kind="normalized")
    )

    assert created and (v1.version, v2.version, v3.version) == ("v1", "v2", "v3")
    assert len({v1.content_hash, v2.content_hash, v3.content_hash}) == 3
    assert set(v1.tasks.values_list("verifier__expected", flat=True)) == {"yes"}
    assert set(v2.tasks.values_list("verifier__expected", flat=True)) == {"no"}


def test_it_assigns_splits_by_hash_unless_the_file_fixes_them(project):
    rows = [{"id": f"t{i}", "input": "x", "expected": "y"} for i in range(60)]
    rows[0]["split"] = "heldout"
    rows[1]["split"] = "search"
    data = "\n".join(json.dumps(r) for r in rows).encode()

    suite, _ = suite_import_jsonl(
        project=project, name="qa", data=data, scorer=EXACT, split_seed="7"
    )

    splits = dict(suite.tasks.values_list("key", "split"))
    assert splits["t0"] == Split.HELDOUT and splits["t1"] == Split.SEARCH
    assert all(splits[f"t{i}"] == split_for(f"t{i}", seed="7") for i in range(2, 60))
    assert set(splits.values()) == {Split.SEARCH, Split.VALIDATION, Split.HELDOUT}


def test_it_stores_the_python_verifier_with_every_task(project):
    source = b"def score(answer, expected, metadata):\n    return answer == expected\n"
    scorer = scorer_spec_build(kind="python", verifier_name="v.py", verifier_source=source)

    suite, _ = suite_import_jsonl(project=project, name="qa", data=suite_file(2), scorer=scorer)

    assert "source" not in suite.scorer
    for task in suite.tasks.all():
        assert task.verifier["scorer"]["source"] == source.decode()


def test_it_refuses_an_invalid_file_and_imports_nothing(project):
    data = suite_file(3) + b'\n{"id": "q1", "input": "x", "expected": "y"}'

    with pytest.raises(
        SuiteImportError, match=r"line 4: duplicate id 'q1' \(first seen on line 2\)"
    ):
        suite_import_jsonl(project=project, name="qa", data=data, scorer=EXACT)

    assert not Suite.objects.filter(project=project).exists()


def test_it_refuses_a_bad_name_and_a_name_taken_by_another_kind(project):
    suite_import_humaneval(project=project)

    with pytest.raises(SuiteImportError, match="is not a valid suite name"):
        suite_import_jsonl(project=project, name="Q A", data=suite_file(), scorer=EXACT)
    with pytest.raises(SuiteImportError, match="already has a HumanEval suite named 'humaneval'"):
        suite_import_jsonl(project=project, name="humaneval", data=suite_file(), scorer=EXACT)


# --- immutability once used ----------------------------------------------------------------


@pytest.fixture
def used_suite(project, seed_candidate, policy_version):
    suite, _ = suite_import_jsonl(project=project, name="qa", data=suite_file(), scorer=EXACT)
    make_evaluation(
        candidate=seed_candidate,
        suite=suite,
        policy_version=policy_version,
        state=EvaluationState.PENDING,
    )
    return suite


def test_it_refuses_to_change_delete_or_add_tasks_of_a_used_suite(used_suite):
    task = used_suite.tasks.first()
    task.verifier = {"scorer": {"kind": "exact"}, "expected": "changed"}

    with pytest.raises(SuiteInUse, match="its suite has been used by an evaluation"):
        task.save()
    with pytest.raises(SuiteInUse):
        task.delete()
    with pytest.raises(SuiteInUse):
        Task.objects.create(
            suite=used_suite, key="new", split="search", position=99, inputs={}, verifier={}
        )
    task.refresh_from_db()
    assert task.verifier["expected"] == "yes"


def test_it_refuses_to_change_or_delete_a_used_suite_but_allows_a_new_description(used_suite):
    used_suite.content_hash = "0" * 64

    with pytest.raises(SuiteInUse, match="its content_hash cannot change"):
        used_suite.save()
    with pytest.raises(SuiteInUse, match="cannot be deleted"):
        suite_delete(suite=used_suite)
    with pytest.raises(SuiteInUse):
        Suite.objects.get(pk=used_suite.pk).delete()
    # The database refuses too, whatever path a delete takes.
    with pytest.raises(ProtectedError):
        Suite.objects.filter(pk=used_suite.pk).delete()

    fresh = Suite.objects.get(pk=used_suite.pk)
    fresh.description = "now documented"
    fresh.save()
    assert Suite.objects.get(pk=used_suite.pk).description == "now documented"


def test_it_deletes_an_unused_suite(project):
    suite, _ = suite_import_jsonl(project=project, name="qa", data=suite_file(), scorer=EXACT)

    suite_delete(suite=suite)

    assert not Suite.objects.filter(pk=suite.pk).exists()
    assert not Task.objects.filter(suite_id=suite.pk).exists()


def test_it_offers_no_admin_delete_for_a_used_suite(client, used_suite, project):
    from django.contrib.auth import get_user_model

    admin = get_user_model().objects.create_superuser("root", "root@example.com", "pw-12345678")
    unused, _ = suite_import_jsonl(
        project=project, name="other", data=suite_file(answer="x"), scorer=EXACT
    )
    client.force_login(admin)

    used_url = f"/admin/suites/suite/{used_suite.pk}/delete/"
    unused_url = f"/admin/suites/suite/{unused.pk}/delete/"

    assert client.post(used_url, {"post": "yes"}).status_code == 403
    assert client.post(unused_url, {"post": "yes"}).status_code == 302
    assert Suite.objects.filter(pk=used_suite.pk).exists()
    assert not Suite.objects.filter(pk=unused.pk).exists()
