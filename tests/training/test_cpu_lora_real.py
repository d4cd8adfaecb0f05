"""The built-in CPU trainer for real: training runs of it, registered as any trainer is, on an
export of real rollouts, training Gemma 3 270M loaded from the shipped GGUF file (real torch,
transformers and PEFT) for a policy served by llama.cpp, so coevo also writes the adapter as
GGUF and has llama.cpp load it; then continuing the adapter it made, the model read from its
cache (about two minutes on 2 cores, most of it reading the GGUF file the first time)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from coevo.exports.services import trajectory_export_create
from coevo.policies.models import EndpointKind, PolicyEndpoint
from coevo.policies.services import policy_version_create
from coevo.training.adapters import adapter_validate
from coevo.training.builtin import trainer_register_cpu_lora
from coevo.training.models import TrainingState
from coevo.training.services import training_run_create, training_run_execute
from tests.exports.conftest import build, run_evaluation

pytestmark = pytest.mark.django_db(transaction=True)

PASS = ("passed", 1.0)


@pytest.fixture
def gemma_policy(db):
    """Gemma 3 270M as its base policy, on a llama.cpp endpoint nothing serves (the runs train,
    convert, check that llama.cpp loads the adapter, and register; nothing is served)."""
    endpoint = PolicyEndpoint.objects.create(
        name="llamacpp-gemma", base_url="http://127.0.0.1:9/v1", kind=EndpointKind.LLAMACPP
    )
    return policy_version_create(name="gemma", endpoint=endpoint, base_model="gemma-3-270m")


def test_it_trains_a_lora_on_gemma_that_coevo_registers(
    project, owner, seed_candidate, humaneval_suite, gemma_policy
):
    run_evaluation(seed_candidate, humaneval_suite, gemma_policy, results=[PASS, PASS])
    export = build(
        trajectory_export_create(
            project=project,
            format="chat",
            created_by=owner,
            candidate=seed_candidate,
            policy_version=gemma_policy,
        )
    )
    trainer = trainer_register_cpu_lora(options=["--steps", "2", "--batch-size", "2"])
    run = training_run_create(
        project=project, trainer=trainer, export=export, parent_policy=gemma_policy
    )

    run = training_run_execute(run_id=run.id)

    log = (Path(run.run_dir) / "train.log").read_text()
    assert run.state == TrainingState.SUCCEEDED, f"{run.state_detail}\n{log}"
    version = run.policy_version
    assert version.parent == gemma_policy and version.base_model == "gemma-3-270m"
    info = adapter_validate(directory=Path(version.adapter_path), base_model="gemma-3-270m")
    # r=8 on the 4 attention projections of 18 layers: an A and a B each.
    assert (info.rank, info.tensors) == (8, 18 * 4 * 2)
    assert sorted(info.target_modules) == ["k_proj", "o_proj", "q_proj", "v_proj"]
    # What llama.cpp serves: the same LoRA as GGUF, beside the PEFT files, loaded once.
    gguf = version.provenance["adapter_gguf"]
    assert (gguf["rank"], gguf["modules"], gguf["tensors"]) == (8, 18 * 4, 18 * 4 * 2)
    assert (Path(version.adapter_path) / "adapter.gguf").stat().st_size == gguf["size_bytes"]

    # The live log: what was loaded and kept, each step's loss and speed, the total.
    assert "cpu-lora: loaded in " in log
    assert "cpu-lora: training on 4 of 4 row(s)\n" in log
    # The run's limit (the trainer's 3600 s), less the margin to save in.
    assert ", time limit 3570 s\n" in log
    for step in (1, 2):
        assert f"cpu-lora: step {step}/2 loss " in log
    assert "cpu-lora: trained 2 step(s) in " in log
    assert "cpu-lora: saved the adapter to " in log
    assert "\r" not in log  # no progress bars in the live log
    assert "cpu-lora: step 2/2 loss " in run.log_tail

    summary = json.loads((Path(run.run_dir) / "summary.json").read_text())
    assert (summary["steps"], summary["rows_trained"]) == (2, 4)
    assert all(math.isfinite(loss) for loss in summary["losses"])
    print(
        f"\nfirst run: {summary['seconds']} s, {summary['seconds_per_step']} s/step, "
        f"losses {summary['losses']}, adapter {summary['adapter_bytes']:,} bytes"
    )

    # A policy step from the new version continues its adapter (installed read-only), with the
    # base model read from the cache the first run left beside the GGUF file.
    again = training_run_create(
        project=project, trainer=trainer, export=export, parent_policy=version
    )
    again = training_run_execute(run_id=again.id)
    log = (Path(again.run_dir) / "train.log").read_text()
    assert again.state == TrainingState.SUCCEEDED, f"{again.state_detail}\n{log}"
    assert f"cpu-lora: continuing the parent adapter {version.adapter_path}: r=8" in log
    assert "from the cache " in log
    child = again.policy_version
    assert child.parent == version
    assert (
        adapter_validate(directory=Path(child.adapter_path), base_model="gemma-3-270m").tensors
        == 144
    )
    assert run.adapter_sha256 != again.adapter_sha256
    assert child.provenance["adapter_gguf"]["sha256"] != gguf["sha256"]
    summary = json.loads((Path(again.run_dir) / "summary.json").read_text())
    print(f"continued: {summary['seconds']} s, {summary['seconds_per_step']} s/step")
