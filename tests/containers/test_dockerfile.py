"""Reading a task's Dockerfile for its build: FROM rewritten (ARG defaults, stages, scratch),
steps traced to their lines, and image names compared as the engine reads them."""

from __future__ import annotations

import pytest

from workers.containers.dockerfile import DockerfileInvalid, dockerfile_rewrite
from workers.containers.images import image_resolve, reference_key


def test_it_rewrites_external_froms_and_keeps_stages_and_scratch():
    text = (
        "# syntax=docker/dockerfile:1\n"
        "ARG BASE=python:3.13-slim\n"
        "FROM --platform=linux/amd64 ${BASE} AS build\n"
        "RUN make \\\n"
        "    all\n"
        "FROM scratch AS empty\n"
        "FROM build\n"
        "COPY --from=build /out /out\n"
    )
    seen = []

    def base(image: str, line: int) -> str:
        seen.append((image, line))
        return "coevo-base:abc"

    rewritten = dockerfile_rewrite(text, base=base)

    assert seen == [("python:3.13-slim", 3)]
    assert rewritten.text.splitlines() == [
        "# syntax=docker/dockerfile:1",
        "ARG BASE=python:3.13-slim",
        "FROM --platform=linux/amd64 coevo-base:abc AS build",
        "RUN make \\",
        "    all",
        "FROM scratch AS empty",
        "FROM build",
        "COPY --from=build /out /out",
    ]
    assert rewritten.origins == [2, 3, 4, 6, 7, 8]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("FROM $NOPE\n", "FROM uses $NOPE, which has no value"),
        ("RUN true\n", "the Dockerfile has no FROM"),
        ("FROM a\nRUN x \\\n", "ends with a line continuation"),
    ],
)
def test_it_refuses_a_dockerfile_it_cannot_build(text, message):
    with pytest.raises(DockerfileInvalid, match=message.replace("$", r"\$")):
        dockerfile_rewrite(text, base=lambda image, line: image)


@pytest.mark.parametrize(
    ("name", "key"),
    [
        ("python:3.13", "docker.io/library/python:3.13"),
        ("docker.io/library/python:3.13", "docker.io/library/python:3.13"),
        ("index.docker.io/library/ubuntu", "docker.io/library/ubuntu:latest"),
        ("local/debian:bookworm", "docker.io/local/debian:bookworm"),
        ("ghcr.io/org/img", "ghcr.io/org/img:latest"),
        ("localhost:5000/img:1", "localhost:5000/img:1"),
    ],
)
def test_image_names_are_compared_as_the_engine_reads_them(name, key):
    assert reference_key(name) == key


def test_the_image_map_applies_to_any_spelling_of_a_name(settings):
    settings.COEVO_IMAGE_MAP = {"ubuntu:24.04": "local/debian:trixie"}

    assert image_resolve("docker.io/library/ubuntu:24.04") == "local/debian:trixie"
    assert image_resolve("ubuntu") == "ubuntu"
