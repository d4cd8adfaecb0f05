"""Tasks that need their container, end to end: Harbor directories (one written here, and the
shipped coevo/suites/data/workspace-containers) imported with the container backend on, their
solutions checked in containers, examples/workspace-agent evaluated on them by a real Celery
worker over the real broker (its commands in the task's container, the scripted server as the
model), and a rollout's page in a real headless Chromium: where it ran, the diff against the
image's /app, what changed outside it and the test output. Screenshot:
``var/test-artifacts/screenshots/container-rollout.png``."""

from __future__ import annotations

import os
import shutil

import pytest

# playwright's sync API runs an event loop in this thread; the ORM calls the fixtures make
# while it runs are still plain synchronous calls.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

from playwright.sync_api import expect  # noqa: E402

from coevo.evaluations.models import EvaluationState, Rollout, TraceStep  # noqa: E402
from coevo.suites.harbor import suite_import_harbor  # noqa: E402
from coevo.suites.models import Split, Task  # noqa: E402
from tests.conftest import PASSWORD, REPO_ROOT  # noqa: E402
from tests.containers.conftest import BASE_IMAGE  # noqa: E402
from tests.containers.test_task_workspace import DOCKERFILE, TEST_SH  # noqa: E402
from tests.evaluations.test_program_worker import evaluate, import_example  # noqa: E402
from tests.support.example_envs import WHEELHOUSE  # noqa: E402
from tests.web.test_workspace_trace import url  # noqa: E402
from workers.outcomes import RolloutOutcome  # noqa: E402

SCREENSHOT = REPO_ROOT / "var" / "test-artifacts" / "screenshots" / "container-rollout.png"
FIXED = "def add(a, b):\n    return a + b\n"
COMMAND = "cat /opt/made-by-run; touch /opt/agent-was-here"

pytestmark = [pytest.mark.browser]


def harbor_dir(root, keys):
    """Harbor tasks that need their container (a Dockerfile that runs commands)."""
    for key in keys:
        task = root / key
        (task / "environment").mkdir(parents=True)
        (task / "environment" / "Dockerfile").write_text(
            DOCKERFILE.replace("python:3.11-slim-bookworm", "debian:bookworm-slim")
        )
        (task / "environment" / "notes.txt").write_text("fix add\n")
        (task / "instruction.md").write_text("Fix add in repo/calc.py.\n")
        (task / "task.toml").write_text(
            'version = "1.0"\n[environment]\nbuild_timeout_sec = 300.0\ncpus = 1\n'
            '[verifier]\ntimeout_sec = 60.0\n[verifier.env]\nEXPECTED = "a + b"\n'
        )
        (task / "tests").mkdir()
        (task / "tests" / "test.sh").write_text(TEST_SH.replace("'return a + b'", '"$EXPECTED"'))
        (task / "solution").mkdir()
        (task / "solution" / "solve.sh").write_text(
            "#!/bin/bash\nsed -i 's/a - b/a + b/' /app/repo/calc.py && touch /opt/agent-was-here\n"
        )
    return root


def test_a_container_task_is_imported_checked_evaluated_and_shown(
    celery_worker_thread,
    live_server,
    page,
    settings,
    tmp_path,
    project,
    owner,
    policy_version,
    scripted_policy,
    base_image,
):
    settings.COEVO_CONTAINER_BACKEND = True
    settings.COEVO_IMAGE_MAP = {"debian:bookworm-slim": BASE_IMAGE}
    settings.COEVO_HARNESS_FIND_LINKS = str(WHEELHOUSE)
    settings.COEVO_HARNESS_ENV_DIR = tmp_path / "envs"
    keys = [f"fix-add-{i}" for i in range(4)]
    suite, _, report = suite_import_harbor(
        project=project,
        name="container-tasks",
        directory=harbor_dir(tmp_path / "tasks", keys),
        check_solutions=True,
    )
    assert not report.refused, report.refused
    tasks = Task.objects.filter(suite=suite)
    assert tasks.count() == 4
    task = tasks.filter(split=Split.SEARCH).order_by("key").first()
    assert task is not None and task.inputs["environment"]["dockerfile"]

    scripted_policy.tool_rules[:] = [
        ("Fix add", [("run_command", {"command": COMMAND})]),
        ("built", [("read_file", {"path": "repo/calc.py"})]),
        ("return a - b", [("write_file", {"path": "/app/repo/calc.py", "content": FIXED})]),
    ]
    scripted_policy.default = "Fixed add."
    evaluation = evaluate(
        import_example(project, "workspace-agent"),
        suite,
        policy_version,
        task_limit=1,
        knobs={"mode": "tools"},
        timeout_s=300,
    )
    assert evaluation.state == EvaluationState.FINISHED, evaluation.state_detail
    rollout = Rollout.objects.get(evaluation=evaluation)
    assert rollout.outcome == RolloutOutcome.PASSED, rollout.detail
    kinds = list(TraceStep.objects.filter(rollout=rollout).values_list("kind", flat=True))
    assert "environment" in kinds and "workspace_diff" in kinds

    page.goto(f"{live_server.url}/login/")
    page.fill("#id_username", "owner")
    page.fill("#id_password", PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.goto(live_server.url + url(project, rollout))
    section = page.locator("#workspace")
    expect(section.locator("#workspace-container")).to_contain_text("coevo-task:")
    expect(section.locator("#workspace-container")).to_contain_text("network: none")
    expect(section.locator("#workspace-container")).to_contain_text("· 1 CPU ·")
    expect(section.locator("#workspace-container")).to_contain_text("the harness ran in it")
    expect(section).to_contain_text("1 file changed")
    expect(section.locator(".diff .gi", has_text="return a + b")).to_be_visible()
    expect(section.locator("#workspace-verdict")).to_contain_text("passed")
    expect(page.locator("#trace-steps")).to_contain_text(COMMAND)
    # What the command changed outside /app (the tests ran on it) is listed too.
    outside = section.locator("details.workspace-outside")
    expect(outside.locator("summary")).to_contain_text("Outside /app")
    outside.locator("summary").click()
    expect(outside).to_contain_text("added /opt/agent-was-here")
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)
    shutil.rmtree(tmp_path / "tasks")


SHIPPED = REPO_ROOT / "coevo" / "suites" / "data" / "workspace-containers"


def test_the_shipped_container_tasks_import_checked_and_are_solved_through_a_worker(
    celery_worker_thread, settings, tmp_path, project, policy_version, scripted_policy, base_image
):
    """The shipped tasks that need their container: imported with their solutions checked in
    containers, then examples/workspace-agent evaluated on each by a real worker, the scripted
    model running the task's own solution as one command in the task's container."""
    settings.COEVO_CONTAINER_BACKEND = True
    settings.COEVO_IMAGE_MAP = {"debian:bookworm-slim": BASE_IMAGE}
    settings.COEVO_HARNESS_FIND_LINKS = str(WHEELHOUSE)
    settings.COEVO_HARNESS_ENV_DIR = tmp_path / "envs"
    suite, _, report = suite_import_harbor(
        project=project, name="workspace-containers", directory=SHIPPED, check_solutions=True
    )
    keys = sorted(p.name for p in SHIPPED.iterdir() if (p / "task.toml").is_file())
    assert not report.refused and sorted(report.taken) == keys, report.refused
    tasks = Task.objects.filter(suite=suite, split=Split.SEARCH)
    assert tasks.count() == len(keys)  # split seed "0" puts all three in search

    scripted_policy.tool_rules[:] = [
        # The instruction's title picks the task; its solution is the one command run.
        (
            (SHIPPED / key / "instruction.md").read_text().splitlines()[0].lstrip("# "),
            [("run_command", {"command": (SHIPPED / key / "solution" / "solve.sh").read_text()})],
        )
        for key in keys
    ]
    scripted_policy.default = "Done."
    evaluation = evaluate(
        import_example(project, "workspace-agent"),
        suite,
        policy_version,
        task_limit=None,
        knobs={"mode": "tools"},
        timeout_s=600,
    )
    assert evaluation.state == EvaluationState.FINISHED, evaluation.state_detail
    rollouts = Rollout.objects.filter(evaluation=evaluation).select_related("task")
    outcomes = {r.task.key: (r.outcome, r.detail) for r in rollouts}
    assert outcomes == {key: (RolloutOutcome.PASSED, outcomes[key][1]) for key in keys}, outcomes
    for rollout in rollouts:
        kinds = set(TraceStep.objects.filter(rollout=rollout).values_list("kind", flat=True))
        assert {"environment", "helper_call", "workspace_diff", "verdict"} <= kinds
