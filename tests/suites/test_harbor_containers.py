"""Harbor tasks that need their container (a docker_image, or a Dockerfile that runs commands):
stored as they are, with what the worker builds and runs, when COEVO_CONTAINER_BACKEND is on;
refused naming the container backend when it is off; files-only tasks untouched either way."""

from __future__ import annotations

import os

import pytest

from coevo.suites import docker_context
from coevo.suites.harbor import suite_import_harbor
from tests.support.harbor import write_harbor_task
from workers.environments.workspace_files import tree_validate

pytestmark = pytest.mark.django_db

RUN_DOCKERFILE = """\
FROM python:3.13-slim-bookworm
RUN apt-get update && apt-get install -y jq
WORKDIR /app
COPY answer.txt /app/answer.txt
RUN pip install six
ENV MODE=test
"""
MINIMAL_TOML = "[verifier]\ntimeout_sec = 30.0\n[agent]\ntimeout_sec = 60.0\n"


@pytest.fixture
def backend(settings):
    settings.COEVO_CONTAINER_BACKEND = True
    settings.COEVO_CONTAINER_PULL = "if-missing"
    settings.COEVO_IMAGE_MAP = {}
    return settings


def imported(project, directory, **options):
    return suite_import_harbor(project=project, name="tasks", directory=directory, **options)


def warnings_of(report, key: str) -> list[str]:
    return [text for task, text in report.warnings if task == key]


def applied_of(report, key: str) -> str:
    (line,) = [w for w in warnings_of(report, key) if w.startswith("task.toml: applied")]
    return line


# --- taken with the backend on ---------------------------------------------------------------


def test_it_takes_a_dockerfile_that_runs_commands_with_what_the_worker_builds(
    project, tmp_path, backend
):
    write_harbor_task(
        tmp_path,
        "needs-image",
        dockerfile=RUN_DOCKERFILE,
        environment={"answer.txt": "0\n", "setup/requirements.txt": "six\n"},
    )

    suite, created, report = imported(project, tmp_path)

    assert created and report.taken == ["needs-image"] and report.refused == []
    task = suite.tasks.get()
    # What the harness is shown stays the files the Dockerfile copies into /app.
    assert task.inputs["files"] == {"answer.txt": {"text": "0\n"}}
    assert task.inputs["environment"] == {
        "dockerfile": RUN_DOCKERFILE,
        "context": {
            "Dockerfile": {"text": RUN_DOCKERFILE},
            "answer.txt": {"text": "0\n"},
            "setup/requirements.txt": {"text": "six\n"},
        },
        "docker_image": None,
        "build_timeout_s": None,
        "cpus": None,
        "memory_bytes": None,
        "storage_bytes": None,
        "allow_internet": True,
    }
    tree_validate(task.inputs["environment"]["context"], label="context")
    assert task.verifier["env"] == {} and task.verifier["solution_env"] == {}
    notes = warnings_of(report, "needs-image")
    assert (
        "runs in its container (COEVO_CONTAINER_BACKEND): the image environment/Dockerfile "
        "builds, with RUN apt-get update && apt-get install -y jq, RUN pip install six"
    ) in notes
    assert "environment.allow_internet = true (Harbor's default)" in applied_of(
        report, "needs-image"
    )
    # ENV is applied by the build: it is no longer reported as ignored.
    assert not any("ignored" in n for n in notes), notes
    assert not any("imported with only" in n for n in notes), notes


def test_it_takes_a_prebuilt_image_without_a_build_context(project, tmp_path, backend):
    write_harbor_task(
        tmp_path,
        "image",
        task_toml=MINIMAL_TOML + '[environment]\ndocker_image = "ghcr.io/org/tb2-task:1.0"\n',
    )
    # A task with an image need not have environment/ at all.
    write_harbor_task(
        tmp_path,
        "image-only",
        dockerfile=None,
        environment={},
        task_toml='[environment]\ndocker_image = "python:3.13@sha256:' + "a" * 64 + '"\n',
    )

    suite, _, report = imported(project, tmp_path)

    assert report.taken == ["image", "image-only"]
    image = suite.tasks.get(key="image")
    assert image.inputs["environment"]["docker_image"] == "ghcr.io/org/tb2-task:1.0"
    assert image.inputs["environment"]["dockerfile"] is None
    assert image.inputs["environment"]["context"] == {}
    assert image.inputs["files"] == {"answer.txt": {"text": "0\n"}}
    assert (
        "environment/Dockerfile is not built: [environment] docker_image takes precedence, "
        "as in Harbor"
    ) in warnings_of(report, "image")
    only = suite.tasks.get(key="image-only")
    assert only.inputs["environment"]["docker_image"].startswith("python:3.13@sha256:")
    assert only.inputs["files"] == {}


def test_it_refuses_a_prebuilt_image_without_environment_when_the_backend_is_off(
    project, tmp_path, settings
):
    settings.COEVO_CONTAINER_BACKEND = False
    write_harbor_task(
        tmp_path,
        "image-only",
        dockerfile=None,
        environment={},
        task_toml='[environment]\ndocker_image = "ghcr.io/org/tb2-task:1.0"\n',
    )
    write_harbor_task(tmp_path, "ok")

    _, _, report = imported(project, tmp_path)

    assert "COEVO_CONTAINER_BACKEND=1" in dict(report.refused)["image-only"]


def test_it_notes_an_image_the_workers_cannot_pull_or_map(project, tmp_path, backend):
    backend.COEVO_CONTAINER_PULL = "never"
    backend.COEVO_IMAGE_MAP = {"python:3.13-slim": "local/debian:trixie"}
    toml = MINIMAL_TOML + "[environment]\ndocker_image = {!r}\n"
    write_harbor_task(tmp_path, "unmapped", task_toml=toml.format("ghcr.io/org/x:1"))
    write_harbor_task(tmp_path, "mapped", task_toml=toml.format("python:3.13-slim"))

    _, _, report = imported(project, tmp_path)

    assert report.taken == ["mapped", "unmapped"]
    assert any("COEVO_CONTAINER_PULL=never" in n for n in warnings_of(report, "unmapped"))
    assert not any("COEVO_CONTAINER_PULL" in n for n in warnings_of(report, "mapped"))


def test_it_applies_resources_and_env_and_lists_them(project, tmp_path, backend):
    write_harbor_task(
        tmp_path,
        "resources",
        dockerfile=RUN_DOCKERFILE,
        task_toml=(
            MINIMAL_TOML
            + '[verifier.env]\nTEST_MODE = "strict"\nURL = "${HOST_URL}"\n'
            + '[solution]\nenv = { OPENAI_API_KEY = "none" }\n'
            + "[environment]\nbuild_timeout_sec = 900.0\ncpus = 2\nmemory_mb = 4096\n"
            + "storage_mb = 10240\nallow_internet = false\ngpus = 0\n"
        ),
    )
    write_harbor_task(
        tmp_path,
        "sizes",
        dockerfile=RUN_DOCKERFILE,
        task_toml=MINIMAL_TOML + '[environment]\nmemory = "2G"\nstorage = "512M"\ncpus = 0.5\n',
    )

    suite, _, report = imported(project, tmp_path)

    task = suite.tasks.get(key="resources")
    environment = task.inputs["environment"]
    assert environment["build_timeout_s"] == 900.0
    assert environment["cpus"] == 2.0
    assert environment["memory_bytes"] == 4096 * 1024**2
    assert environment["storage_bytes"] == 10240 * 1024**2
    assert environment["allow_internet"] is False
    assert task.verifier["env"] == {"TEST_MODE": "strict", "URL": "${HOST_URL}"}
    assert task.verifier["solution_env"] == {"OPENAI_API_KEY": "none"}
    applied = applied_of(report, "resources")
    for shown in (
        "environment.build_timeout_sec = 900",
        "environment.cpus = 2",
        "environment.memory_mb = 4096 (4096 MiB",
        "environment.storage_mb = 10240 (10240 MiB)",
        "environment.allow_internet = false",
        "verifier.env: TEST_MODE, URL",
        "solution.env: OPENAI_API_KEY",
    ):
        assert shown in applied, applied
    notes = warnings_of(report, "resources")
    # What is applied leaves the "not applied" list; what is not (gpus) stays on it.
    (not_applied,) = [n for n in notes if n.startswith("task.toml: not applied here")]
    assert not_applied == "task.toml: not applied here: environment.gpus"
    assert any("${NAME} in one is not filled in" in n for n in notes), notes

    sizes = suite.tasks.get(key="sizes").inputs["environment"]
    assert sizes["memory_bytes"] == 2 * 1024**3
    assert sizes["storage_bytes"] == 512 * 1024**2
    assert sizes["cpus"] == 0.5
    assert "environment.memory = '2G' (2048 MiB" in applied_of(report, "sizes")


def test_a_files_only_task_keeps_its_data_and_its_hash_with_the_backend_on(
    project, tmp_path, settings
):
    write_harbor_task(
        tmp_path,
        "plain",
        task_toml=MINIMAL_TOML + '[environment]\ncpus = 2\n[verifier.env]\nA = "1"\n',
    )
    settings.COEVO_CONTAINER_BACKEND = False
    before, _, _ = imported(project, tmp_path)
    settings.COEVO_CONTAINER_BACKEND = True

    suite, created, report = imported(project, tmp_path)

    assert not created and suite == before
    task = suite.tasks.get()
    assert "environment" not in task.inputs
    assert set(task.verifier) == {"tests", "solution", "timeout_s"}
    # It runs in the bwrap sandbox, where neither is applied.
    assert "task.toml: not applied here: verifier.env, environment.cpus" in warnings_of(
        report, "plain"
    )


def test_a_changed_dockerfile_or_resource_is_a_new_version(project, tmp_path, backend):
    root = write_harbor_task(tmp_path, "t", dockerfile=RUN_DOCKERFILE)
    first, _, _ = imported(project, tmp_path)
    same, created, _ = imported(project, tmp_path)
    assert same == first and not created

    (root / "environment" / "Dockerfile").write_text(RUN_DOCKERFILE + "RUN pip install attrs\n")
    second, created, _ = imported(project, tmp_path)
    assert created and second.version == "v2"

    (root / "task.toml").write_text(MINIMAL_TOML + "[environment]\ncpus = 4\n")
    third, created, _ = imported(project, tmp_path)
    assert created and third.version == "v3"

    (root / "environment" / "unused.txt").write_text("only in the build context\n")
    fourth, created, _ = imported(project, tmp_path)
    assert created and fourth.version == "v4"


# --- the build context ----------------------------------------------------------------------


def test_it_applies_dockerignore_to_the_build_context(project, tmp_path, backend):
    root = write_harbor_task(
        tmp_path,
        "ignored",
        dockerfile=RUN_DOCKERFILE,
        environment={
            "answer.txt": "0\n",
            ".dockerignore": "secret.txt\n*.log\n!keep.log\nbuild/\n",
            "secret.txt": "hunter2\n",
            "debug.log": "noise\n",
            "keep.log": "kept\n",
            "build/out.bin": "x\n",
            "src/main.py": "print(1)\n",
        },
    )
    # A link the build does not send is no obstacle; one it sends is refused (below).
    os.symlink("/etc/passwd", root / "environment" / "build" / "passwd")

    suite, _, report = imported(project, tmp_path)

    assert report.taken == ["ignored"]
    context = suite.tasks.get().inputs["environment"]["context"]
    assert sorted(context) == [
        ".dockerignore",
        "Dockerfile",
        "answer.txt",
        "keep.log",
        "src/main.py",
    ]


def test_it_refuses_a_link_the_build_context_would_send(project, tmp_path, backend):
    root = write_harbor_task(tmp_path, "link", dockerfile=RUN_DOCKERFILE)
    os.symlink("/etc/passwd", root / "environment" / "passwd")
    write_harbor_task(tmp_path, "ok")

    _, _, report = imported(project, tmp_path)

    assert dict(report.refused)["link"] == (
        "environment/passwd is a symbolic link; only plain files are taken (list it in "
        "environment/.dockerignore if the image does not need it)"
    )


def test_it_refuses_a_build_context_over_the_tree_bounds(project, tmp_path, backend, monkeypatch):
    monkeypatch.setattr(docker_context, "MAX_TREE_FILES", 3)
    write_harbor_task(
        tmp_path,
        "big",
        dockerfile=RUN_DOCKERFILE,
        environment={"answer.txt": "0\n", "a": "a", "b": "b", "c": "c"},
    )
    write_harbor_task(tmp_path, "ok", environment={"answer.txt": "0\n"})

    _, _, report = imported(project, tmp_path)

    assert dict(report.refused)["big"].startswith(
        "environment/ holds more than 3 files or 16 MiB once .dockerignore is applied"
    )


def test_it_refuses_a_dockerfile_over_the_builders_limit(project, tmp_path, backend):
    write_harbor_task(tmp_path, "long", dockerfile=RUN_DOCKERFILE + "# pad\n" * 12000)
    write_harbor_task(tmp_path, "ok")

    _, _, report = imported(project, tmp_path)

    assert "over the 64 KiB limit" in dict(report.refused)["long"]


# --- refused ---------------------------------------------------------------------------------


def test_it_refuses_a_compose_task_with_the_backend_on(project, tmp_path, backend):
    write_harbor_task(
        tmp_path,
        "compose",
        dockerfile=RUN_DOCKERFILE,
        environment={"answer.txt": "0\n", "docker-compose.yaml": "services: {}\n"},
    )
    write_harbor_task(tmp_path, "ok")

    _, _, report = imported(project, tmp_path)

    reason = dict(report.refused)["compose"]
    assert reason.startswith("environment/docker-compose.yaml defines the task's containers")
    assert "multi-container tasks are not supported" in reason
    assert "COEVO_CONTAINER_BACKEND" not in reason, reason


def test_it_refuses_a_task_that_needs_its_container_naming_the_backend_when_off(
    project, tmp_path, settings
):
    settings.COEVO_CONTAINER_BACKEND = False
    write_harbor_task(tmp_path, "needs-image", dockerfile=RUN_DOCKERFILE)
    write_harbor_task(tmp_path, "ok")

    _, _, report = imported(project, tmp_path)

    reason = dict(report.refused)["needs-image"]
    assert reason.endswith(
        "the task needs its container, which the bwrap sandbox cannot build; set "
        "COEVO_CONTAINER_BACKEND=1 on the web process and the workers (docs/deployment.md, "
        '"The container backend") to import it as it is, or pass --allow-dockerfile (API: '
        "allow_dockerfile) to import it with only its copied files"
    ), reason

    suite, _, report = imported(project, tmp_path, allow_dockerfile=True)

    assert "environment" not in suite.tasks.get(key="needs-image").inputs
    (warning,) = [w for w in warnings_of(report, "needs-image") if "skipped" in w]
    assert "COEVO_CONTAINER_BACKEND=1" in warning


@pytest.mark.parametrize(
    ("environment", "reason"),
    [
        ("cpus = 0", "[environment] cpus must be above 0, got 0"),
        ("cpus = 'two'", "[environment] cpus must be a number of CPUs, got 'two'"),
        ("cpus = nan", "[environment] cpus must be a number of CPUs, got nan"),
        ("memory_mb = -1", "[environment] memory_mb must be above 0, got -1"),
        ("storage_mb = true", "[environment] storage_mb must be a number of MiB, got True"),
        ("build_timeout_sec = inf", "[environment] build_timeout_sec must be a number of seconds"),
        ("memory = 'lots'", '[environment] memory must be a size such as "512M" or "4G"'),
        ("storage = 4096", '[environment] storage must be a size such as "512M" or "4G"'),
        ("memory = '512K'", "[environment] memory = '512K' is under 1 MiB"),
        ("storage_mb = 0.5", "[environment] storage_mb = 0.5 is under 1 MiB"),
        ("allow_internet = 'yes'", "[environment] allow_internet must be true or false"),
        ("docker_image = 'has space:1'", "docker_image = 'has space:1' is not an image reference"),
        ('docker_image = "x\\u0007y"', "is not an image reference"),
        ("docker_image = 3", "[environment] docker_image must be an image name"),
        (f"docker_image = '{'a' * 256}'", "docker_image is 256 characters, over the 255"),
    ],
)
def test_it_refuses_environment_values_it_cannot_apply(
    project, tmp_path, backend, environment, reason
):
    write_harbor_task(
        tmp_path, "t", dockerfile=RUN_DOCKERFILE, task_toml=f"[environment]\n{environment}\n"
    )
    write_harbor_task(tmp_path, "ok")

    _, _, report = imported(project, tmp_path)

    assert reason in dict(report.refused)["t"], report.refused


@pytest.mark.parametrize(
    ("tables", "reason"),
    [
        ("[verifier]\nenv = 'A=1'\n", "[verifier] env must be a table of names to strings"),
        ("[verifier.env]\nA = 1\n", "[verifier] env: A must be a string, got 1; quote it"),
        ('[solution.env]\n"1BAD" = "x"\n', "[solution] env: '1BAD' is not a variable name"),
        ('[solution.env]\n"A-B" = "x"\n', "[solution] env: 'A-B' is not a variable name"),
        (
            "[verifier.env]\n" + "".join(f'V{i} = "x"\n' for i in range(65)),
            "[verifier] env has 65 variables, over the limit of 64",
        ),
        (
            f'[verifier.env]\nBIG = "{"x" * 4097}"\n',
            "[verifier] env: BIG is 4097 bytes, over the 4 KiB limit",
        ),
        ("solution = 3\n", "[solution] must be a table"),
    ],
)
def test_it_refuses_env_maps_it_cannot_apply(project, tmp_path, backend, tables, reason):
    write_harbor_task(tmp_path, "t", dockerfile=RUN_DOCKERFILE, task_toml=tables)
    write_harbor_task(tmp_path, "ok")

    _, _, report = imported(project, tmp_path)

    assert reason in dict(report.refused)["t"], report.refused
