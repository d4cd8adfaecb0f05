"""The candidate diff page: every changed file shown or named, never silently left out."""

from __future__ import annotations

import html
import re
import shutil
import tracemalloc

import pytest
from django.urls import reverse

from harness_store.repo import HarnessRepo
from harness_store.services import candidate_import_directory
from tests.conftest import SEED_HARNESS

pytestmark = pytest.mark.django_db


def _plain(response) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", response.content.decode())).split())


def _child(project, seed_candidate, tmp_path, files: dict[str, str]):
    directory = tmp_path / "child"
    shutil.copytree(SEED_HARNESS, directory)
    for name, content in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(content)
    candidate, created = candidate_import_directory(
        project=project,
        directory=directory,
        message="A change",
        author_name="Proposer",
        parent=seed_candidate,
    )
    assert created
    return candidate


def _diff_page(client, project, candidate):
    return client.get(reverse("web:candidate_diff", args=[project.slug, candidate.sha]))


def test_it_shows_a_file_whose_name_git_quotes(client, owner, project, seed_candidate, tmp_path):
    # The case: a new module with a non-ASCII name, imported from agent.py. git writes
    # its header as `diff --git "a/A\303\251.py" "b/A\303\251.py"`; the page showed
    # "1 file changed" and no trace of it.
    agent = (SEED_HARNESS / "agent.py").read_text()
    child = _child(
        project,
        seed_candidate,
        tmp_path,
        {"agent.py": "import Aé  # noqa\n" + agent, "Aé.py": "import os\nos.system('id')\n"},
    )
    client.force_login(owner)

    response = _diff_page(client, project, child)

    assert response.status_code == 200
    page = _plain(response)
    assert "2 files changed" in page
    assert "Aé.py +2 −0" in page
    assert "+os.system('id')" in page
    file_url = reverse("web:candidate_file", args=[project.slug, child.sha, "Aé.py"])
    assert f'href="{file_url}"' in response.content.decode()


def test_it_shows_names_with_tabs_quotes_newlines_and_b_slash(
    client, owner, project, seed_candidate, tmp_path
):
    names = ["tab\there.py", 'quo"te.py', "x b/y.py", "new\nline.py"]
    child = _child(project, seed_candidate, tmp_path, {name: "X = 1\n" for name in names})
    client.force_login(owner)

    response = _diff_page(client, project, child)

    assert response.status_code == 200
    assert f"{len(names)} files changed" in _plain(response)
    for name in names:
        url = reverse("web:candidate_file", args=[project.slug, child.sha, name])
        assert f'href="{html.escape(url)}">{html.escape(name)}</a>' in response.content.decode()
        # Each links to a file page that opens (a newline travels as %0A).
        assert client.get(url).status_code == 200, name
    # The candidate page lists them with the same links.
    page = client.get(reverse("web:candidate", args=[project.slug, child.sha]))
    assert page.status_code == 200


def test_it_says_a_diff_is_too_large_to_show_and_still_names_its_files(
    client, owner, project, seed_candidate, tmp_path, settings
):
    settings.COEVO_MAX_DIFF_BYTES = 64 * 1024
    child = _child(
        project, seed_candidate, tmp_path, {"data.txt": "0123456789\n" * 100_000, "Aé.py": "A=1\n"}
    )
    client.force_login(owner)

    tracemalloc.start()
    try:
        response = _diff_page(client, project, child)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    assert response.status_code == 200
    page = _plain(response)
    assert "Too large to show: The diff is larger than 65536 bytes" in page
    assert "2 files changed" in page
    assert "Aé.py" in page and "data.txt" in page
    assert "0123456789" not in page
    # The 1.1 MB diff was never read whole into the web process.
    assert peak < 1024 * 1024, peak


def test_it_shows_an_error_instead_of_a_diff_it_cannot_read(
    client, owner, project, seed_candidate, clamped_child, monkeypatch
):
    real = HarnessRepo._diff_output
    # As if git wrote a line the reader does not know (a future git's new header line).
    monkeypatch.setattr(
        HarnessRepo,
        "_diff_output",
        lambda self, *a, **k: real(self, *a, **k).replace(b"\n@@", b"\nfuture header\n@@", 1),
    )
    client.force_login(owner)

    response = _diff_page(client, project, clamped_child)

    assert response.status_code == 200
    page = _plain(response)
    assert "could not be read ('future header')" in page
    assert "files changed" not in page and "No differences" not in page
