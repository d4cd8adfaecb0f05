"""Fixtures of the training tests: their own directories, a vLLM-kind base policy, a ready
export of real (hand-finished) rollouts to train on, and the shipped Gemma 3 270M GGUF (its
shapes, and a llama.cpp-kind policy serving it) for the llama.cpp adapter tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from coevo.exports.services import trajectory_export_create
from coevo.policies.embedded import DEFAULT_MODEL_ALIAS, base_model_gguf
from coevo.policies.models import EndpointKind, PolicyEndpoint, PolicyVersion
from coevo.policies.services import policy_version_create
from coevo.training.gguf_adapter import BaseLayout, base_gguf_layout
from tests.exports.conftest import build, run_evaluation
from tests.support.browser import browser, page  # noqa: F401  (the run page's browser test)

PASS = ("passed", 1.0)


@pytest.fixture(autouse=True)
def dirs(settings, tmp_path):
    settings.COEVO_TRAINING_DIR = tmp_path / "training"
    settings.COEVO_ADAPTER_DIR = tmp_path / "adapters"
    settings.COEVO_EXPORT_DIR = tmp_path / "exports"
    return tmp_path


@pytest.fixture
def export(project, owner, seed_candidate, humaneval_suite, base_policy):
    """A ready chat export of the seed's rollouts under the base policy (2 passed rollouts,
    2 model calls each: 4 rows)."""
    run_evaluation(seed_candidate, humaneval_suite, base_policy, results=[PASS, PASS])
    built = build(
        trajectory_export_create(
            project=project,
            format="chat",
            created_by=owner,
            candidate=seed_candidate,
            policy_version=base_policy,
        )
    )
    assert built.rows == 4
    return built


@pytest.fixture(autouse=True)
def _empty_queue(empty_queue):
    yield


# --- llama.cpp: the shipped Gemma 3 270M as the base model -----------------------------------

# Hugging Face's name for each projection of a block, and the GGUF tensor it becomes.
GEMMA_MODULES = {
    "q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
    "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down",
}  # fmt: skip
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


@pytest.fixture(scope="session")
def gemma_gguf() -> Path:
    """The shipped Gemma 3 270M GGUF, where the training service looks for it."""
    return base_model_gguf(DEFAULT_MODEL_ALIAS)


@pytest.fixture(scope="session")
def gemma_layout(gemma_gguf) -> BaseLayout:
    return base_gguf_layout(path=gemma_gguf)


@pytest.fixture(scope="session")
def gemma_shapes(gemma_layout) -> dict[str, tuple[int, int]]:
    """Every projection's (out, in), read from the GGUF (block 0; all blocks are alike)."""
    return {hf: gemma_layout.shapes[f"blk.0.{name}.weight"] for hf, name in GEMMA_MODULES.items()}


@pytest.fixture
def llamacpp_policy(db) -> PolicyVersion:
    """Gemma 3 270M on a llama.cpp-kind endpoint nothing serves (training never calls it)."""
    endpoint = PolicyEndpoint.objects.create(
        name="llamacpp-test", base_url="http://127.0.0.1:9/v1", kind=EndpointKind.LLAMACPP
    )
    return policy_version_create(name="gemma", endpoint=endpoint, base_model=DEFAULT_MODEL_ALIAS)
