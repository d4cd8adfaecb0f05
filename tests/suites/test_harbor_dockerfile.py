"""Reading a Harbor task's Dockerfile for the files it copies into /app (no Docker involved)."""

from __future__ import annotations

import io
import re
import tarfile
import time
import tracemalloc

import pytest

from coevo.suites import dockerfile
from coevo.suites.docker_context import glob_pattern
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


# --- variables: bounded before they are built -----------------------------------------------


def doubling(lines: int) -> str:
    """The issue's Dockerfile: each ENV line doubles the value of the one before it."""
    steps = "".join(f"ENV V{n}=$V{n - 1}$V{n - 1}\n" for n in range(1, lines + 1))
    return "FROM a\nENV V0=" + "x" * 64 + "\n" + steps


def test_it_refuses_env_lines_that_double_a_value_past_its_limit(tmp_path):
    # V10 holds 64 KiB, the most one value may; V11 (line 13) would hold twice that.
    assert files_of(tmp_path, doubling(10) + "COPY a.txt /app/\n", {"a.txt": "a"}).tree

    with pytest.raises(DockerfileError) as raised:
        files_of(tmp_path, doubling(11) + "COPY a.txt /app/\n", {"a.txt": "a"})

    assert str(raised.value).startswith(
        "environment/Dockerfile: line 13: its variables expand to 131072 characters, over the "
        "64 KiB limit on one expanded value"
    )


BIG = "x" * 32 * 1024


@pytest.mark.parametrize(
    "text",
    [
        f"ARG BIG={BIG}\nARG X=$BIG$BIG$BIG\nFROM a\n",  # before FROM: the global ARGs
        f"FROM a\nARG BIG={BIG}\nARG X=${{BIG}}$BIG$BIG\n",
        f"FROM a\nENV BIG={BIG}\nENV X=$BIG$BIG$BIG\n",
        f"FROM a\nENV BIG={BIG}\nENV X $BIG$BIG$BIG\n",  # the legacy form
        f"FROM a\nENV BIG={BIG}\nWORKDIR $BIG$BIG$BIG\n",
        f"FROM a\nENV BIG={BIG}\nCOPY a.txt $BIG$BIG$BIG\n",
        f"FROM a\nENV BIG={BIG}\nADD $BIG$BIG$BIG /app/\n",
    ],
)
def test_it_bounds_every_expansion(tmp_path, text):
    with pytest.raises(DockerfileError) as raised:
        files_of(tmp_path, text, {"a.txt": "a"})

    assert re.match(
        r"environment/Dockerfile: line [23]: its variables expand to 98304 characters, over the "
        r"64 KiB limit",
        str(raised.value),
    ), raised.value


def test_it_bounds_what_all_the_expansions_make_together(tmp_path):
    # 40,000 characters, each under the limit on one value: the seventh (line 8) passes 256 KiB.
    copies = "".join(f"ENV C{n}=$BIG\n" for n in range(6))

    with pytest.raises(DockerfileError) as raised:
        files_of(tmp_path, "FROM a\nENV BIG=" + "x" * 40_000 + "\n" + copies, {})

    assert str(raised.value).startswith(
        "environment/Dockerfile: line 8: the Dockerfile's variables expand to more than 256 KiB "
        "in all"
    )


def test_it_refuses_an_expansion_before_building_it(tmp_path):
    # One word naming a 60,000-character value 1,000 times: 60 MB if it were built first.
    text = "FROM a\nENV BIG=" + "x" * 60_000 + "\nCOPY " + "$BIG" * 1000 + " /app/\n"
    tracemalloc.start()
    try:
        with pytest.raises(DockerfileError) as raised:
            files_of(tmp_path, text, {})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert peak < 4 * 1024**2, peak
    assert "expand to 60000000 characters, over the 64 KiB limit" in str(raised.value)


# --- glob patterns: linear-time matching, bounded patterns ----------------------------------


@pytest.mark.parametrize(
    ("glob", "double_star", "matching", "others"),
    [
        ("*.py", False, ["a.py", ".py"], ["a/b.py", "a.pyc"]),
        ("**/__pycache__", True, ["__pycache__", "a/b/__pycache__"], ["a__pycache__"]),
        ("a/**", True, ["a/b", "a/b/c"], ["a", "b/a/c"]),
        ("file?.txt", False, ["file1.txt", "fileé.txt"], ["file.txt", "file/.txt"]),
        ("s?", False, ["s\udcff"], ["s\udcff\udcfe"]),  # a name byte that is not UTF-8
        ("[a-c]x", False, ["ax", "cx"], ["dx", "-x"]),
        ("[!a-c]x", False, ["dx", "-x"], ["ax", "bx"]),
        ("[]a]", False, ["]", "a"], ["b"]),
        ("[^]a]", False, ["b"], ["]", "a"]),
        ("[[:alpha:]]", False, ["a]", ":]"], ["b]", "a"]),  # not a POSIX class: its characters
        ("\\*.txt", False, ["*.txt"], ["a.txt"]),
        ("a.b+(c)|$", False, ["a.b+(c)|$"], ["axb+(c)|$", "a.bb(c)|$"]),
        ("x" * 300, True, ["x" * 300], ["x" * 299]),  # no wildcard: compared as text
    ],
)
def test_it_reads_glob_patterns_as_docker_does(glob, double_star, matching, others):
    pattern = glob_pattern(glob, double_star=double_star, where="t")

    assert [name for name in matching + others if pattern.matches(name)] == matching


LONG_NAME = "a" * 80


@pytest.mark.parametrize(
    ("dockerfile", "context", "taken"),
    [
        # The issue's .dockerignore: Python's re read `**a` seven times as `.*a` seven times
        # and tried every way to place them in the name (~30 s for this one, minutes for a
        # longer one) holding the interpreter lock.
        ("FROM a\nCOPY . /app/\n", {".dockerignore": "**a" * 7 + "b\n"}, LONG_NAME),
        # COPY sources are globs too: `*a` as `[^/]*a`.
        ("FROM a\nCOPY " + "*a" * 7 + "b /app/\n", {"aaaaaaab": "y"}, "aaaaaaab"),
    ],
)
def test_it_matches_a_backtracking_pattern_against_a_long_name_in_linear_time(
    tmp_path, dockerfile, context, taken
):
    started = time.monotonic()
    result = files_of(tmp_path, dockerfile, {LONG_NAME: "x", **context})

    assert time.monotonic() - started < 5
    assert taken in result.tree


@pytest.mark.parametrize(
    ("dockerfile", "dockerignore", "where", "reason"),
    [
        (
            "FROM a\nCOPY . /app/\n",
            "*.pyc\n" + "**a" * 9 + "\n",
            "environment/.dockerignore: line 2",
            "has 9 wildcards (*, **, ?, [...]), over the limit of 8",
        ),
        (
            "FROM a\nCOPY " + "?" * 9 + " /app/\n",
            "",
            "environment/Dockerfile: line 2",
            "has 9 wildcards (*, **, ?, [...]), over the limit of 8",
        ),
        (
            "FROM a\nCOPY . /app/\n",
            "src/" + "x" * 300 + "*\n",
            "environment/.dockerignore: line 1",
            "is 305 characters, over the limit of 256 for a pattern with wildcards",
        ),
    ],
)
def test_it_refuses_a_pattern_over_its_bounds(tmp_path, dockerfile, dockerignore, where, reason):
    with pytest.raises(DockerfileError) as raised:
        files_of(tmp_path, dockerfile, {".dockerignore": dockerignore, "a.txt": "a"})

    message = str(raised.value)
    assert message.startswith(f"{where}: the pattern ") and reason in message, message
