"""The repository's docs stand on their own: no file cites the design notes kept outside the
repository, and every link from README.md and docs/ to a file of the repository resolves."""

from __future__ import annotations

import re

from tests.conftest import REPO_ROOT

OUTSIDE = re.compile(r"\b(?:DESIGN|STYLE|RESEARCH)\.md\b")
# [text](target): a relative target, without its #anchor.
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")
CHECKED = ("coevo", "workers", "harness_store", "tests", "benchmarks", "scripts", "templates",
           "docs", "examples", ".ci")  # fmt: skip
SUFFIXES = {".py", ".md", ".html", ".sh", ".toml", ".txt", ".yml", ".yaml", ""}


def test_no_file_cites_the_design_notes_outside_the_repository():
    citing = []
    paths = [REPO_ROOT / "README.md", *(p for d in CHECKED for p in (REPO_ROOT / d).rglob("*"))]
    for path in paths:
        if not path.is_file() or path.suffix not in SUFFIXES:
            continue
        if "__pycache__" in path.parts or "data" in path.parts:
            continue
        text = path.read_text(errors="replace")
        if path.name != "test_docs.py" and OUTSIDE.search(text):
            citing.append(str(path.relative_to(REPO_ROOT)))
    assert not citing, f"these cite a file outside the repository: {citing}"


# A repository path named in a doc's text (`tests/test_logs.py`), not a task's own tests/.
NAMED = re.compile(
    r"(?<![/\w])((?:coevo|workers|harness_store|benchmarks|scripts|examples)/"
    r"[\w./-]+\.(?:py|md|sh|html|toml)|tests/(?:\w+/)*test_\w+\.py)\b"
)


def test_repository_paths_named_in_the_docs_exist():
    missing = sorted(
        f"{doc.relative_to(REPO_ROOT)}: {path}"
        for doc in [REPO_ROOT / "README.md", *(REPO_ROOT / "docs").glob("*.md")]
        for path in set(NAMED.findall(doc.read_text()))
        if not (REPO_ROOT / path).exists()
    )
    assert not missing, f"paths named in the docs that do not exist: {missing}"


def test_links_to_repository_files_resolve():
    broken = []
    for doc in [REPO_ROOT / "README.md", *(REPO_ROOT / "docs").glob("*.md")]:
        for target in LINK.findall(doc.read_text()):
            if re.match(r"^[a-z]+:", target):  # https:, mailto:
                continue
            if not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(REPO_ROOT)} -> {target}")
    assert not broken, f"links to files that do not exist: {broken}"
