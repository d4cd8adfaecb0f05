from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from harness_store.models import Candidate
from tests.api.conftest import assert_error, seed_tarball
from tests.conftest import SEED_HARNESS

BASE = "/api/v1/projects/demo/candidates/"


def _git(cwd: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "CI",
        "GIT_AUTHOR_EMAIL": "ci@example.com",
        "GIT_COMMITTER_NAME": "CI",
        "GIT_COMMITTER_EMAIL": "ci@example.com",
        "HOME": str(cwd),
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def work_repo(tmp_path) -> Path:
    """A CI checkout: the seed harness, then a second commit changing the prompt."""
    repo = tmp_path / "work"
    shutil.copytree(SEED_HARNESS, repo, ignore=shutil.ignore_patterns("__pycache__"))
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "seed")
    (repo / "NOTES.md").write_text("second\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "second")
    return repo


def _bundle(repo: Path, *revs: str) -> bytes:
    _git(repo, "bundle", "create", "-q", "out.bundle", *revs)
    data = (repo / "out.bundle").read_bytes()
    (repo / "out.bundle").unlink()
    return data


def _upload(client, path: str, **fields):
    return client.post(BASE + path, fields, format="multipart")


def test_it_lists_and_gets_candidates_by_sha_prefix(make_client, viewer, seed_candidate):
    client = make_client(viewer, ["read"])
    listing = client.get(BASE).json()
    assert [c["sha"] for c in listing["results"]] == [seed_candidate.sha]
    body = client.get(f"{BASE}{seed_candidate.sha[:7]}/").json()
    assert body["sha"] == seed_candidate.sha
    assert body["dashboard_url"].endswith(f"/p/demo/c/{seed_candidate.sha}/")
    assert_error(client.get(f"{BASE}{'0' * 40}/"), 404, "not_found")


def test_it_lists_files_serves_raw_bytes_and_diffs(make_client, viewer, seed_candidate):
    client = make_client(viewer, ["read"])
    files = client.get(f"{BASE}{seed_candidate.sha}/files/").json()
    assert {"path": "harness.toml", "size": (SEED_HARNESS / "harness.toml").stat().st_size} in files
    raw = client.get(f"{BASE}{seed_candidate.sha}/files/harness.toml")
    assert raw["Content-Type"] == "application/octet-stream"
    assert raw.content == (SEED_HARNESS / "harness.toml").read_bytes()
    assert_error(client.get(f"{BASE}{seed_candidate.sha}/files/nope.txt"), 404, "not_found")
    diff = client.get(f"{BASE}{seed_candidate.sha}/diff/").json()
    assert diff["base"] is None and "harness.toml" in diff["diff"]


def test_it_says_which_commits_it_knows(make_client, viewer, seed_candidate):
    response = make_client(viewer, ["read"]).post(
        f"{BASE}known/", {"shas": ["f" * 40, seed_candidate.sha, "junk"]}, format="json"
    )
    assert response.json() == {"known": [seed_candidate.sha]}


def test_it_imports_a_bundle_keeping_shas_then_answers_200(make_client, researcher, work_repo):
    client = make_client(researcher, kind="ci")
    head = _git(work_repo, "rev-parse", "HEAD")
    bundle = _bundle(work_repo, "main")
    response = _upload(client, "import-bundle/", bundle=SimpleUploadedFile("b", bundle), ref=head)
    assert response.status_code == 201, response.content
    assert response.json()["sha"] == head
    assert response.json()["origin"] == "ci"
    assert Candidate.objects.count() == 2  # the commit and its parent
    again = _upload(client, "import-bundle/", bundle=SimpleUploadedFile("b", bundle), ref="main")
    assert again.status_code == 200


def test_it_refuses_a_thin_bundle_naming_the_missing_commits(make_client, researcher, work_repo):
    parent = _git(work_repo, "rev-parse", "HEAD~1")
    bundle = _bundle(work_repo, "HEAD~1..main")
    response = _upload(
        make_client(researcher),
        "import-bundle/",
        bundle=SimpleUploadedFile("b", bundle),
        ref="main",
    )
    error = assert_error(response, 400, "missing_prerequisites")
    assert error["details"]["missing"] == [parent]
    assert not Candidate.objects.exists()


def test_it_refuses_a_corrupt_bundle_and_an_absent_ref(make_client, researcher, work_repo):
    client = make_client(researcher)
    junk = SimpleUploadedFile("b", b"# v2 git bundle\nnot really\n")
    assert_error(_upload(client, "import-bundle/", bundle=junk, ref="main"), 400, "invalid_bundle")
    bundle = SimpleUploadedFile("b", _bundle(work_repo, "main"))
    assert_error(
        _upload(client, "import-bundle/", bundle=bundle, ref="nope"), 400, "invalid_bundle"
    )
    assert not Candidate.objects.exists()


def test_it_refuses_an_upload_over_the_limit_before_reading_it(settings, make_client, researcher):
    settings.COEVO_API_MAX_UPLOAD_MB = 1
    big = SimpleUploadedFile("b", b"0" * (2 * 1024**2))
    response = _upload(make_client(researcher), "import-bundle/", bundle=big, ref="main")
    assert_error(response, 413, "payload_too_large")


def test_it_imports_a_tarball_as_a_new_commit(make_client, researcher, seed_candidate):
    client = make_client(researcher)
    archive = SimpleUploadedFile("h.tgz", seed_tarball({"NOTES.md": b"hello\n"}))
    response = _upload(
        client, "import-tarball/", archive=archive, message="notes", parent=seed_candidate.sha
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["parent_shas"] == [seed_candidate.sha]
    assert body["author_name"] == "researcher" and body["origin"] == "manual"
    same = SimpleUploadedFile("h.tgz", seed_tarball({"NOTES.md": b"hello\n"}))
    assert _upload(client, "import-tarball/", archive=same, message="again").status_code == 200


@pytest.mark.parametrize("name", ["../evil.py", "/etc/evil.py", "a/../../evil.py"])
def test_it_refuses_a_tarball_with_paths_outside(make_client, researcher, project, name):
    archive = SimpleUploadedFile("h.tgz", seed_tarball({name: b"x = 1\n"}))
    response = _upload(make_client(researcher), "import-tarball/", archive=archive, message="m")
    assert_error(response, 400, "unsafe_archive")
    assert not Candidate.objects.exists()


def test_it_refuses_a_tarball_with_a_symlink_pointing_outside(make_client, researcher, project):
    import io
    import tarfile

    buffer = io.BytesIO(seed_tarball())
    data = bytearray()
    with tarfile.open(fileobj=buffer, mode="r:gz") as source:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as tar:
            for member in source.getmembers():
                tar.addfile(member, source.extractfile(member) if member.isfile() else None)
            link = tarfile.TarInfo("prompts/leak")
            link.type = tarfile.SYMTYPE
            link.linkname = "../../../etc/passwd"
            tar.addfile(link)
        data = out.getvalue()
    archive = SimpleUploadedFile("h.tar", bytes(data))
    response = _upload(make_client(researcher), "import-tarball/", archive=archive, message="m")
    assert_error(response, 400, "unsafe_archive")
    assert not Candidate.objects.exists()


def test_it_refuses_a_tarball_that_is_not_one(make_client, researcher, project):
    archive = SimpleUploadedFile("h.tgz", b"this is not a tarball")
    response = _upload(make_client(researcher), "import-tarball/", archive=archive, message="m")
    assert response.status_code == 400
    assert not Candidate.objects.exists()


def test_it_needs_the_archive_and_message_fields(make_client, researcher, project):
    error = assert_error(_upload(make_client(researcher), "import-tarball/"), 400, "invalid_input")
    assert set(error["details"]["fields"]) == {"archive", "message"}
