"""The shipped workspace suite (coevo/suites/data/workspace/): every task imports, its own
reference solution passes the real verifier, and its untouched starting state does not."""

from __future__ import annotations

from coevo.suites.harbor import WORKSPACE_DATA_DIR, suite_import_workspace_basic
from coevo.suites.models import Split


def test_every_shipped_task_is_solvable_and_starts_failing(project):
    checked: list[str] = []
    suite, created, report = suite_import_workspace_basic(
        project=project,
        check_solutions=True,
        progress=lambda done, total, key: checked.append(key),
    )
    tasks = sorted(p.name for p in WORKSPACE_DATA_DIR.iterdir() if (p / "task.toml").is_file())
    assert created and len(tasks) >= 20
    assert report.refused == [] and report.warnings == [], (report.refused, report.warnings)
    assert sorted(report.taken) == tasks and sorted(checked) == tasks
    splits = set(suite.tasks.values_list("split", flat=True))
    assert splits == {Split.SEARCH, Split.VALIDATION, Split.HELDOUT}
    # Imported again: the same suite.
    again, created_again, _ = suite_import_workspace_basic(project=project)
    assert again == suite and not created_again
