import subprocess
from pathlib import Path

import pytest


def run(directory):
    proc = subprocess.run(["bash", "/app/linecount.sh", str(directory)], cwd="/tmp",
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def make(root, files):
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root


def test_sample():
    assert run("/app/sample") == "5"


def test_nested_and_spaces(tmp_path):
    root = make(tmp_path / "my docs", {
        "a.txt": "1\n2\n",
        "deep/er/b.txt": "1\n2\n3\n",
        "with space/c d.txt": "x\n" * 10,
        "skip.md": "x\n" * 100,
        "skip.txt.bak": "x\n" * 100,
        "empty.txt": "",
    })
    assert run(root) == "15"


def test_no_txt_files(tmp_path):
    root = make(tmp_path / "none", {"readme.md": "a\nb\n"})
    assert run(root) == "0"


def test_empty_dir(tmp_path):
    (tmp_path / "empty").mkdir()
    assert run(tmp_path / "empty") == "0"


def test_many_files(tmp_path):
    root = make(tmp_path / "many", {"f%03d.txt" % i: "line\n" * i for i in range(120)})
    assert run(root) == str(sum(range(120)))
