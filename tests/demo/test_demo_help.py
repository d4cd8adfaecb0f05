"""`scripts/demo --help` answers at once, before anything is installed: a new user reading the
options must not wait for llama.cpp to compile."""

from __future__ import annotations

import os
import subprocess

from tests.conftest import REPO_ROOT


def test_it_prints_the_demos_options_without_installing_anything(tmp_path):
    # A PATH without the project's virtual environment, and a HOME with no cache: were the
    # script to install first, it would say so ("==> …") and take minutes.
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    result = subprocess.run(
        ["bash", "scripts/demo", "--help"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: scripts/demo")
    assert "--once" in result.stdout and "--campaign-proposals" in result.stdout
    assert "--policy {llamacpp,vllm}" in result.stdout and "vLLM's CPU build" in result.stdout
    assert "first installs what is missing" in result.stdout
    assert "==>" not in result.stdout + result.stderr
    assert not os.path.exists(tmp_path / ".cache")
