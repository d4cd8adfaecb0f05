"""Task images on the real engine: built from a Dockerfile and its context (apt from Debian's
mirror, pip from PyPI through the CA layer), cached by content, built once under concurrency,
failures that name their step, names mapped or refused, builds stopped at their time."""

from __future__ import annotations

import io
import re
import secrets
import threading
import time
from pathlib import Path

import certifi
import docker.errors
import pytest

from tests.containers.conftest import BASE_IMAGE, SHARED_CONTEXT, TASK_BASE
from workers.containers import (
    ImageBuildFailed,
    ImageUnavailable,
    container_run,
    image_for_task,
)
from workers.containers.ca import CA_BUNDLE, ca_certificates
from workers.containers.engine import engine_client


def test_a_task_image_builds_with_its_debian_and_pypi_packages(task_image):
    run = container_run(
        task_image.image,
        [
            "sh",
            "-c",
            "jq --version && python3 -c 'import six; print(six.__version__)' && "
            "cat /app/hello.txt && /app/bin/tool.sh && pwd",
        ],
        timeout_s=60,
    )

    assert run.stdout.decode().split() == ["jq-1.6", "1.16.0", "hello", "tool", "/app"]
    assert not task_image.cached and task_image.image.startswith("coevo-task:")
    assert "Successfully installed six-1.16.0" in task_image.log
    assert "Setting up jq" in task_image.log


def test_the_operator_ca_certificates_are_in_the_image(task_image):
    if ca_certificates() is None:  # nothing to add: the image has no CA layer
        listed = container_run(
            task_image.image, ["ls", "/usr/local/share/ca-certificates/coevo"], timeout_s=60
        )
        assert listed.returncode != 0
        return
    names = " ".join(ca_certificates().files)

    run = container_run(
        task_image.image,
        ["sh", "-c", f"echo $PIP_CERT $SSL_CERT_FILE; ls {CA_BUNDLE}"],
        timeout_s=60,
    )
    listed = container_run(
        task_image.image, ["ls", "/usr/local/share/ca-certificates/coevo"], timeout_s=60
    )

    assert run.stdout.decode().split() == [CA_BUNDLE, CA_BUNDLE, CA_BUNDLE]
    assert listed.stdout.decode().split() == names.split()


def test_the_same_content_builds_once(task_image, shared_dockerfile, image_map):
    again = image_for_task(
        dockerfile=shared_dockerfile, context=dict(SHARED_CONTEXT), build_timeout_s=900
    )

    assert again.cached and again.seconds < 5
    assert (again.image, again.image_id) == (task_image.image, task_image.image_id)
    assert again.log == task_image.log  # the log of the build that made it


def test_another_context_is_another_image(task_image, shared_dockerfile, image_map):
    context = {**SHARED_CONTEXT, "hello.txt": {"text": "changed\n"}}

    other = image_for_task(dockerfile=shared_dockerfile, context=context, build_timeout_s=900)
    try:
        # The engine's layer cache still serves the RUN steps: only the COPY is new.
        assert not other.cached and other.image != task_image.image and other.seconds < 60
        assert "Using cache" in other.log
    finally:
        engine_client().api.remove_image(other.image, force=True)


def test_concurrent_builds_of_one_content_build_once(base_image, image_map):
    dockerfile = f"FROM {TASK_BASE}\nRUN echo {secrets.token_hex(8)} > /built && sleep 2\n"
    results: list = []

    def build() -> None:
        results.append(image_for_task(dockerfile=dockerfile, context={}, build_timeout_s=300))

    threads = [threading.Thread(target=build) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert len(results) == 3
        assert sorted(result.cached for result in results) == [False, True, True]
        assert len({result.image_id for result in results}) == 1
    finally:
        engine_client().api.remove_image(results[0].image, force=True)


def test_a_failed_run_step_names_the_instruction_and_its_line(base_image, image_map):
    dockerfile = (
        f"FROM {TASK_BASE}\n"
        "# comments and continuations count no step\n"
        "RUN echo first && \\\n    echo {nonce}\n"
        "RUN echo the-output-before-failing; exit 3\n"
        "RUN echo never\n"
    ).format(nonce=secrets.token_hex(4))

    with pytest.raises(ImageBuildFailed) as failed:
        image_for_task(dockerfile=dockerfile, context={}, build_timeout_s=300)

    error = failed.value
    assert (error.step, error.line, error.timed_out) == (
        "RUN echo the-output-before-failing; exit 3",
        5,
        False,
    )
    assert "failed with exit code 3" in str(error)
    assert "the-output-before-failing" in str(error) and "never" not in error.log
    # The layers of the steps that worked (after the base's) are not left behind.
    base, *made = re.findall(r"^ ---> ([0-9a-f]{12})$", error.log, re.MULTILINE)
    assert len(made) == 1
    engine_client().api.inspect_image(base)
    with pytest.raises(docker.errors.ImageNotFound):
        engine_client().api.inspect_image(made[0])


def test_a_build_past_its_time_is_stopped(base_image, image_map, engine):
    dockerfile = f"FROM {TASK_BASE}\nRUN echo {secrets.token_hex(4)} && sleep 300\n"
    started = time.monotonic()

    with pytest.raises(ImageBuildFailed) as failed:
        image_for_task(dockerfile=dockerfile, context={}, build_timeout_s=3)

    assert failed.value.timed_out and "ran past its 3 s" in str(failed.value)
    assert time.monotonic() - started < 30
    running = engine_client().api.containers(filters={"ancestor": BASE_IMAGE})
    assert not [c for c in running if "sleep 300" in c.get("Command", "")]


def test_an_unmapped_image_that_cannot_be_pulled_is_a_clear_error(engine, settings):
    dockerfile = "FROM registry.invalid/coevo/nothing:1\nRUN true\n"
    settings.COEVO_CONTAINER_PULL = "never"

    with pytest.raises(ImageUnavailable) as never:
        image_for_task(dockerfile=dockerfile, context={})
    settings.COEVO_CONTAINER_PULL = "if-missing"
    with pytest.raises(ImageUnavailable) as pulled:
        image_for_task(docker_image="registry.invalid/coevo/nothing:1")

    assert "Dockerfile line 1 (FROM registry.invalid/coevo/nothing:1)" in str(never.value)
    assert "COEVO_CONTAINER_PULL=never forbids pulling it" in str(never.value)
    assert "pulling it failed" in str(pulled.value) and "COEVO_IMAGE_MAP" in str(pulled.value)


def test_a_task_docker_image_is_mapped_to_a_local_image(base_image, image_map, settings):
    settings.COEVO_CONTAINER_PULL = "never"  # present once mapped: nothing to pull

    image = image_for_task(docker_image=f"docker.io/library/{TASK_BASE}")
    run = container_run(image.image, ["cat", "/etc/debian_version"], timeout_s=60)

    assert run.returncode == 0 and run.stdout.startswith(b"12.")
    expected = BASE_IMAGE if ca_certificates() is None else "coevo-base:"
    assert image.image.startswith(expected)


def test_an_image_without_a_shell_gets_the_ca_layer_without_running_anything(
    engine, settings, tmp_path
):
    # An operator's CA folder of the test's own (a public root from certifi's bundle), so the
    # test runs whatever this machine trusts.
    bundle = Path(certifi.where()).read_text()
    first = bundle[bundle.index("-----BEGIN CERTIFICATE-----") :]
    first = first[: first.index("-----END CERTIFICATE-----") + len("-----END CERTIFICATE-----")]
    (tmp_path / "operator.crt").write_text(first + "\n")
    settings.COEVO_CONTAINER_CA_CERTS = str(tmp_path)
    client = engine_client()
    tag = f"coevo-test-noshell:{secrets.token_hex(4)}"
    built = client.api.build(
        fileobj=io.BytesIO(b"FROM scratch\nLABEL coevo.test=noshell\n"), tag=tag, rm=True
    )
    for _line in built:
        pass
    image = None
    try:
        image = image_for_task(docker_image=tag)

        history = client.api.history(image.image)
        steps = " ".join(step["CreatedBy"] for step in history)
        assert "COPY" in steps and "update-ca-certificates" not in steps
        assert f"SSL_CERT_FILE={CA_BUNDLE}" in " ".join(
            client.api.inspect_image(image.image)["Config"]["Env"]
        )
    finally:
        if image is not None:
            client.api.remove_image(image.image, force=True)
        client.api.remove_image(tag, force=True)
