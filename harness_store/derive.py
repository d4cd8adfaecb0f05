"""Deriving a candidate from others: their tree plus file changes, as a new commit.

Proposers describe a change as ``{path: new bytes | None (delete)}``; this module is the only
place that turns it into a commit, so proposers never touch git.
"""

from __future__ import annotations

import tempfile
from pathlib import Path, PurePosixPath

from coevo.errors import InvalidInput
from coevo.projects.models import Project
from harness_store.models import Candidate, CandidateOrigin
from harness_store.services import candidate_import_directory, project_repo


def candidate_derive(
    *,
    project: Project,
    parents: list[Candidate],
    changes: dict[str, bytes | None],
    message: str,
    author_name: str,
    author_email: str = "",
    origin: CandidateOrigin = CandidateOrigin.PROPOSER,
) -> tuple[Candidate, bool]:
    """The first parent's tree with ``changes`` applied, committed with ``parents``.

    Returns ``(candidate, created)``: a tree equal to an existing candidate's returns that
    candidate and False (the caller rejects the proposal as a duplicate). Raises InvalidInput
    for a path outside the tree and InvalidManifest when the result is no valid harness.
    """
    if not parents:
        raise InvalidInput("A derived candidate needs at least one parent.")
    if len(parents) > 1:
        # Merge commits need a multi-parent import in harness_store.services (next increment).
        raise InvalidInput(
            "Deriving a candidate from several parents (a merge) is not available yet."
        )
    parent = parents[0]
    if parent.project_id != project.id:
        raise InvalidInput("The parent candidate belongs to another project.")
    with tempfile.TemporaryDirectory(prefix="coevo-derive-") as tmp:
        root = Path(tmp) / "tree"
        root.mkdir()
        project_repo(project=project).export_tree(parent.sha, root)
        for path, content in changes.items():
            target = root / _safe_relative(path)
            if content is None:
                if not target.is_file():
                    raise InvalidInput(f"Cannot delete {path!r}: the parent has no such file.")
                target.unlink()
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(content)
        return candidate_import_directory(
            project=project,
            directory=root,
            message=message,
            author_name=author_name,
            author_email=author_email,
            parent=parent,
            origin=origin,
        )


def _safe_relative(path: str) -> PurePosixPath:
    relative = PurePosixPath(path.replace("\\", "/"))
    if (
        not path.strip()
        or relative.is_absolute()
        or ".." in relative.parts
        or relative.parts[:1] == (".git",)
    ):
        raise InvalidInput(f"{path!r} is not a path inside the harness.")
    return relative
