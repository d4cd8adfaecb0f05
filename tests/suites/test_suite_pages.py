"""The dashboard's suite pages: list, detail (held-out sealed), import (researchers and up)."""

from __future__ import annotations

import html
import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from coevo.evaluations.models import EvaluationState
from coevo.projects.models import Role
from coevo.projects.services import membership_set
from coevo.suites.jsonl import scorer_spec_build
from coevo.suites.models import Split, Suite
from coevo.suites.services import suite_import_humaneval
from tests.support.factories import make_evaluation, make_jsonl_suite

pytestmark = pytest.mark.django_db

HELDOUT_INPUT = "heldout-input-marker"
EXPECTED = "expected-answer-marker"
VERIFIER_SOURCE = "verifier-source-marker"
SEARCH_INPUT = "search-input-marker"


def text(response) -> str:
    return html.unescape(response.content.decode())


@pytest.fixture
def planted_suite(project):
    """A suite whose held-out inputs, expected answers and verifier carry marker strings."""
    rows = [
        {"id": "open-1", "input": SEARCH_INPUT, "expected": EXPECTED, "split": "search"},
        {"id": "open-2", "input": {"q": "v"}, "expected": EXPECTED, "split": "validation"},
        {"id": "sealed-1", "input": HELDOUT_INPUT, "expected": EXPECTED, "split": "heldout"},
        {
            "id": "sealed-2",
            "input": {"question": HELDOUT_INPUT},
            "expected": EXPECTED,
            "metadata": {"hint": HELDOUT_INPUT},
            "split": "heldout",
        },
    ]
    source = f"# {VERIFIER_SOURCE}\ndef score(answer, expected, metadata):\n    return True\n"
    return make_jsonl_suite(
        project,
        rows,
        name="planted",
        scorer=scorer_spec_build(kind="python", verifier_name="v.py", verifier_source=source),
    )


def suite_pages(project, suite) -> list[str]:
    detail = reverse("web:suite", args=[project.slug, suite.id])
    return [
        reverse("web:project", args=[project.slug]),
        reverse("web:suites", args=[project.slug]),
        detail,
        f"{detail}?split=heldout",
        f"{detail}?split=search",
    ]


# --- access --------------------------------------------------------------------------------


def test_it_answers_404_to_an_outsider_on_every_suite_page(
    client, outsider, project, planted_suite
):
    client.force_login(outsider)

    for url in [
        *suite_pages(project, planted_suite),
        reverse("web:suite_import", args=[project.slug]),
    ]:
        response = client.get(url)
        assert response.status_code == 404, url
        assert "planted" not in response.content.decode()


def test_it_answers_404_for_a_suite_of_another_project(client, owner, project, planted_suite):
    from coevo.projects.services import project_get_or_create

    other = project_get_or_create(slug="other", name="Other")
    membership_set(project=other, user=owner, role=Role.ADMIN)
    client.force_login(owner)

    assert client.get(reverse("web:suite", args=[other.slug, planted_suite.id])).status_code == 404


def test_it_forbids_a_viewer_to_import(client, viewer, project):
    client.force_login(viewer)
    url = reverse("web:suite_import", args=[project.slug])

    assert client.get(url).status_code == 403
    assert client.post(url, {"kind": "humaneval"}).status_code == 403
    assert not Suite.objects.filter(project=project).exists()
    assert "Import a suite" not in text(client.get(reverse("web:suites", args=[project.slug])))


# --- sealed held-out, hidden references ----------------------------------------------------


def test_it_never_shows_held_out_inputs_expected_values_or_verifier_source(
    client, owner, project, planted_suite
):
    client.force_login(owner)

    for url in suite_pages(project, planted_suite):
        page = text(client.get(url))
        assert HELDOUT_INPUT not in page, url
        assert EXPECTED not in page, url
        assert VERIFIER_SOURCE not in page, url

    detail = text(client.get(reverse("web:suite", args=[project.slug, planted_suite.id])))
    assert "sealed-1" in detail and "sealed-2" in detail  # keys and splits stay visible
    assert SEARCH_INPUT in detail


def test_it_seals_held_out_humaneval_prompts(client, owner, project):
    suite, _ = suite_import_humaneval(project=project)

    def signature(task) -> str:
        return f"def {task.inputs['entry_point']}("

    # Tasks whose signature falls inside the page's input preview, so a leak would show it.
    def early(split):
        tasks = suite.tasks.filter(split=split).order_by("position")
        return next(t for t in tasks if t.inputs["prompt"].find(signature(t)) < 150)

    heldout, search = early(Split.HELDOUT), early(Split.SEARCH)
    client.force_login(owner)
    url = reverse("web:suite", args=[project.slug, suite.id])

    page = text(client.get(url, {"split": "heldout"})) + text(client.get(url, {"page": 1}))

    assert heldout.key in page
    assert signature(heldout) not in page
    assert signature(search) in page


# --- the list ------------------------------------------------------------------------------


def test_it_lists_suites_with_versions_split_counts_and_use(
    client, owner, project, planted_suite, seed_candidate, policy_version
):
    make_evaluation(
        candidate=seed_candidate,
        suite=planted_suite,
        policy_version=policy_version,
        state=EvaluationState.PENDING,
    )
    client.force_login(owner)

    page = text(client.get(reverse("web:suites", args=[project.slug])))

    row = page[page.index(">planted<") :].split("</tr>")[0]
    cells = [c.split(">")[-1] for c in row.split("</td>")]
    assert "v1" in cells and "Python" not in cells
    assert [c for c in cells if c.isdigit()] == ["1", "1", "2"]
    assert "used by 1" in row


# --- import ----------------------------------------------------------------------------------


def upload(name: str, content: bytes) -> SimpleUploadedFile:
    return SimpleUploadedFile(name, content, content_type="application/octet-stream")


def test_it_imports_a_jsonl_upload_and_redirects_to_the_new_suite(client, researcher, project):
    client.force_login(researcher)
    data = b"\n".join(
        json.dumps({"id": f"n{i}", "input": f"{i}*2", "expected": i * 2}).encode()
        for i in range(10)
    )

    response = client.post(
        reverse("web:suite_import", args=[project.slug]),
        {
            "kind": "jsonl",
            "name": "doubles",
            "scorer": "numeric",
            "tolerance": "0.5",
            "file": upload("doubles.jsonl", data),
            "split_seed": "0",
        },
    )

    suite = Suite.objects.get(project=project, name="doubles")
    assert response.status_code == 302
    assert response["Location"] == reverse("web:suite", args=[project.slug, suite.id])
    assert suite.scorer == {"kind": "numeric", "abs_tol": 0.5, "rel_tol": 0.0}
    assert suite.tasks.count() == 10
    assert "Imported doubles v1." in text(client.get(response["Location"]))

    again = client.post(
        reverse("web:suite_import", args=[project.slug]),
        {
            "kind": "jsonl",
            "name": "doubles",
            "scorer": "numeric",
            "tolerance": "0.5",
            "file": upload("doubles.jsonl", data),
        },
        follow=True,
    )
    assert "already has exactly this content" in text(again)
    assert Suite.objects.filter(project=project, name="doubles").count() == 1


def test_it_shows_every_line_error_on_the_form_capped_with_a_count(client, researcher, project):
    client.force_login(researcher)
    data = b"\n".join(json.dumps({"id": f"x{i}", "input": "q"}).encode() for i in range(25))

    response = client.post(
        reverse("web:suite_import", args=[project.slug]),
        {"kind": "jsonl", "name": "broken", "scorer": "exact", "file": upload("b.jsonl", data)},
    )

    page = text(response)
    assert response.status_code == 400
    assert "line 1: field 'expected' is missing" in page
    assert "line 20: field 'expected' is missing" in page
    assert "line 21: field" not in page
    assert "… and 5 more errors." in page
    assert not Suite.objects.filter(project=project).exists()


def test_it_imports_humaneval_from_its_button(client, researcher, project):
    client.force_login(researcher)

    response = client.post(reverse("web:suite_import", args=[project.slug]), {"kind": "humaneval"})

    suite = Suite.objects.get(project=project, name="humaneval")
    assert response.status_code == 302 and suite.tasks.count() == 164


def test_it_reports_a_missing_verifier_on_the_form(client, researcher, project):
    client.force_login(researcher)
    data = json.dumps({"id": "a", "input": "q", "expected": "x"}).encode()

    response = client.post(
        reverse("web:suite_import", args=[project.slug]),
        {"kind": "jsonl", "name": "py", "scorer": "python", "file": upload("a.jsonl", data)},
    )

    assert response.status_code == 400
    assert "the python scorer needs a verifier module" in text(response)


def test_it_imports_textworld_from_its_button(client, researcher, project):
    client.force_login(researcher)

    response = client.post(reverse("web:suite_import", args=[project.slug]), {"kind": "textworld"})

    suite = Suite.objects.get(project=project)
    assert response.status_code == 302
    assert response["Location"] == reverse("web:suite", args=[project.slug, suite.id])
    assert suite.get_kind_display() == "TextWorld"
