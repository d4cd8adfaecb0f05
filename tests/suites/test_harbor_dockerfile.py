"""Reading a Harbor task's Dockerfile for the files it copies into /app (no Docker involved)."""

from __future__ import annotations

import io
import re
import tarfile

import pytest

from coevo.suites import dockerfile
from coevo.suites.dockerfile import DockerfileError, dockerfile_files, dockerfile_parse


def files_of(tmp_path, text: str, context: dict[str, str | bytes]):
    for path, data in context.items():
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data.encode() if isinstance(data, str) else data)
    (tmp_path / "Dockerfile").write_text(text)
    return dockerfile_files(context=tmp_path, dockerfile=tmp_path / "Dockerfile")


def test_it_joins_continuations_drops_comments_and_skips_heredoc_bodies():
    text = (
        "# syntax=docker/dockerfile:1\n"
        "\n"
        "FROM python:3.12 AS base\n"
        "RUN echo a \\\n"
        "  # inside\n"
        "\n"
        "  && echo b\n"
        "RUN <<EOF\n"
        "COPY not-an-instruction /app/\n"
        "EOF\n"
        "copy a.txt /app/\n"
    )

    parsed = [(i.line, i.keyword, i.args) for i in dockerfile_parse(text)]

    assert parsed == [
        (3, "FROM", "python:3.12 AS base"),
        (4, "RUN", "echo a && echo b"),
        (8, "RUN", "<<EOF"),
        (11, "COPY", "a.txt /app/"),
    ]


def test_it_honours_the_escape_directive():
    parsed = dockerfile_parse("# escape=`\nFROM a\nCOPY a.txt `\n  /app/\n")

    assert [(i.keyword, i.args) for i in parsed] == [("FROM", "a"), ("COPY", "a.txt /app/")]


def test_it_refuses_a_dangling_continuation():
    with pytest.raises(DockerfileError, match="ends with a line continuation"):
        dockerfile_parse("FROM a\nCOPY a \\\n")


def test_it_maps_destinations_as_docker_build_does(tmp_path):
    result = files_of(
        tmp_path,
        "FROM a\n"
        "WORKDIR /app\n"
        "COPY a.txt renamed.txt\n"  # a file to a file name
        "COPY a.txt /app/dir/\n"  # into a directory (trailing slash)
        "COPY a.txt b.txt multi\n"  # several sources: a directory
        "COPY lib lib\n"  # a directory's contents, not the directory
        "COPY a.txt /app\n"  # /app itself is a directory
        'COPY ["b.txt", "/app/json/"]\n'  # the JSON form
        "ARG WHERE=vars\nENV NAME=a.txt\nCOPY $NAME ${WHERE}/\n"
        "COPY a.txt lib\n",  # lib exists in the tree: into it
        {"a.txt": "a", "b.txt": "b", "lib/x.py": "x", "lib/sub/y.py": "y"},
    )

    assert sorted(result.tree) == [
        "a.txt",
        "dir/a.txt",
        "json/b.txt",
        "lib/a.txt",
        "lib/sub/y.py",
        "lib/x.py",
        "multi/a.txt",
        "multi/b.txt",
        "renamed.txt",
        "vars/a.txt",
    ]
    assert result.unsupported == []
    assert result.ignored == ["ARG WHERE=vars", "ENV NAME=a.txt"]


def test_later_copies_overwrite_earlier_ones_and_chmod_sets_the_mode(tmp_path):
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    (tmp_path / "run.sh").chmod(0o755)
    result = files_of(
        tmp_path,
        "FROM a\nCOPY v1/f.txt /app/f.txt\nCOPY v2/f.txt /app/f.txt\n"
        "COPY run.sh /app/\nCOPY --chmod=644 run.sh /app/plain.sh\n",
        {"v1/f.txt": "one", "v2/f.txt": "two"},
    )

    assert result.tree["f.txt"] == {"text": "two"}
    assert result.tree["run.sh"] == {"text": "#!/bin/sh\n", "executable": True}
    assert result.tree["plain.sh"] == {"text": "#!/bin/sh\n"}


def test_a_relative_destination_needs_workdir_app(tmp_path):
    result = files_of(tmp_path, "FROM a\nCOPY a.txt .\n", {"a.txt": "a"})

    assert result.tree == {} and result.unsupported == ["COPY a.txt ."]


def test_add_of_a_local_archive_needs_the_container(tmp_path):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("inside.txt")
        tar.addfile(info, io.BytesIO(b""))
    result = files_of(
        tmp_path,
        "FROM a\nADD data.tar.gz /app/\nADD a.txt /app/\n",
        {"data.tar.gz": buffer.getvalue(), "a.txt": "a"},
    )

    assert result.unsupported == ["ADD data.tar.gz /app/"]
    assert sorted(result.tree) == ["a.txt"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("COPY a.txt /app/\n", "COPY before FROM"),
        ("FROM a\nCOPY missing.txt /app/\n", "the source 'missing.txt' matches nothing"),
        ("FROM a\nCOPY *.py /app/\n", "the source '*.py' matches nothing"),
        ("FROM a\nCOPY a.txt\n", "needs at least a source and a destination"),
        ("FROM a\nCOPY a.txt /app/a.txt\nCOPY a.txt /app/a.txt/b\n", "both a file and a directory"),
        ("LABEL x=y\n", "it has no FROM instruction"),
    ],
)
def test_it_refuses_what_cannot_be_built(tmp_path, text, message):
    with pytest.raises(DockerfileError, match=re.escape(message)):
        files_of(tmp_path, text, {"a.txt": "a"})


def test_it_refuses_a_dockerfile_over_its_size_limit(tmp_path):
    with pytest.raises(DockerfileError, match="over the 64 KiB limit"):
        files_of(tmp_path, "FROM a\n" + "# pad\n" * 20000, {})


def test_it_bounds_what_the_copies_may_hold(tmp_path, monkeypatch):
    monkeypatch.setattr(dockerfile, "MAX_TREE_BYTES", 10)
    with pytest.raises(DockerfileError, match="copies more than"):
        files_of(tmp_path, "FROM a\nCOPY a.txt /app/\n", {"a.txt": "x" * 11})
