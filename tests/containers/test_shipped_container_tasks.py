"""The shipped tasks that need their container (coevo/suites/data/workspace-containers/), read
as the Harbor importer stores them for the container backend: on the real engine each untouched
start fails and each reference solution passes; without its image (the bubblewrap sandbox, with
only the files its Dockerfile copies) each reference solution fails."""

from __future__ import annotations

import pytest

from coevo.suites.harbor import WORKSPACE_DATA_DIR
from coevo.suites.harbor_tasks import HarborTask, harbor_task_read
from tests.containers.conftest import BASE_IMAGE
from workers.environments.workspace import solution_check

DATA_DIR = WORKSPACE_DATA_DIR.parent / "workspace-containers"
TASKS = sorted(p.name for p in DATA_DIR.iterdir() if (p / "task.toml").is_file())
# What every task's Dockerfile starts with, so that the engine builds this layer once for all.
SHARED_START = (
    "FROM debian:bookworm-slim\n"
    "RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates git jq "
    "python3 python3-pip && rm -rf /var/lib/apt/lists/*\n"
)
# What each reference solution meets without its image: what only the image's RUN steps give.
WITHOUT_IMAGE = {
    "fix-region-totals": "datamash: command not found",
    "fix-toml-export": "No module named 'tomli_w'",
    "fix-version-regression": "cd: /app/project: No such file or directory",
}


@pytest.fixture
def debian_map(settings, image_map) -> dict[str, str]:
    """The tasks' FROM as the local Debian image: registries are unreachable here."""
    settings.COEVO_IMAGE_MAP = {**image_map, "debian:bookworm-slim": BASE_IMAGE}
    return settings.COEVO_IMAGE_MAP


def task_read(key: str) -> HarborTask:
    task, _ = harbor_task_read(key=key, directory=DATA_DIR / key, container_backend=True)
    return task


def test_the_tasks_are_shipped_apart_from_the_workspace_suite():
    assert TASKS == ["fix-region-totals", "fix-toml-export", "fix-version-regression"]
    readme = (DATA_DIR / "README.md").read_text()
    assert all(f"`{key}`" in readme for key in TASKS)
    # The workspace-basic suite imports its own directory only: none of these in it.
    assert not set(TASKS) & {p.name for p in WORKSPACE_DATA_DIR.iterdir()}


@pytest.mark.parametrize("key", TASKS)
def test_each_task_is_stored_with_its_container(key):
    # The same first layer in each (SHARED_START): the engine builds it once for all.
    environment = task_read(key).inputs["environment"]
    assert environment["dockerfile"].startswith(SHARED_START)
    assert environment["build_timeout_s"] == 600
    assert environment["allow_internet"] is False
    assert environment["docker_image"] is None


@pytest.mark.parametrize("key", TASKS)
def test_each_solution_passes_in_its_container(key, base_image, debian_map):
    task = task_read(key)
    check = solution_check(inputs=task.inputs, verifier=task.verifier)
    assert not check.start.passed, (check.start.detail, check.start.output)
    assert check.solution is not None
    assert check.solution.passed, (check.solution.detail, check.solution.output, check.solve_output)


@pytest.mark.parametrize("key", TASKS)
def test_each_solution_fails_without_its_image(key):
    task = task_read(key)
    bare = {name: value for name, value in task.inputs.items() if name != "environment"}
    check = solution_check(inputs=bare, verifier=task.verifier)
    assert check.solution is not None
    assert not check.solution.passed, (check.solution.detail, check.solve_output)
    assert WITHOUT_IMAGE[key] in check.solution.output + check.solve_output
