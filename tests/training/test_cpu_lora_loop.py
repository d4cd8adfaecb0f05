"""The CPU trainer's training loop on a tiny Gemma 3 (random weights, a byte vocabulary; real
torch, transformers and PEFT, a second a test): the loss on the model turn only, determinism
under a seed, continuing a parent adapter, the time limit, and what is saved."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from coevo.training.adapters import adapter_validate
from coevo.training.cpu_lora.loop import (
    batch_loss,
    batch_tensors,
    batches,
    lora_train,
    steps_planned,
)
from coevo.training.cpu_lora.model import adapter_save, lora_attach, parent_adapter_check
from coevo.training.cpu_lora.rows import Sequence

SEQUENCES = [
    Sequence([1, 5, 6, 7, 8, 9, 2], 3),
    Sequence([1, 10, 11, 12, 2], 2),
    Sequence([1, 20, 21, 2], 1),
    Sequence([1, 30, 31, 32, 33, 34, 35, 2], 4),
]


def tiny_model(seed: int = 0) -> Gemma3ForCausalLM:
    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        vocab_size=260, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
        sliding_window=16, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    return Gemma3ForCausalLM(config)


def tiny_lora(seed: int = 0, **kwargs):
    model = tiny_model()
    torch.manual_seed(seed)
    options = {"rank": 4, "alpha": 8, "dropout": 0.1, "targets": ["q_proj", "v_proj"]}
    return lora_attach(model, parent_adapter=None, **(options | kwargs))


def train(model, steps: int = 4, **kwargs):
    options = {"batch_size": 2, "learning_rate": 1e-2, "seed": 0, "pad_id": 0, "deadline": None}
    options["log"] = lambda line: None
    return lora_train(model, SEQUENCES, steps=steps, **(options | kwargs))


def lora_weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def test_the_loss_covers_the_model_turn_only():
    model = tiny_lora()
    tensors = batch_tensors(SEQUENCES[:3], pad_id=0)
    # Position t predicts token t + 1: from the prompt's last token to the one before EOS.
    assert tensors["predicts"].int().tolist() == [
        [0, 0, 1, 1, 1, 1, 0],
        [0, 1, 1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0],
    ]
    # The same as transformers' own loss with the prompt and the padding masked out.
    labels = tensors["ids"].clone()
    for row, sequence in enumerate(SEQUENCES[:3]):
        labels[row, : sequence.prompt_tokens] = -100
        labels[row, len(sequence.ids) :] = -100
    model.eval()
    expected = model(
        input_ids=tensors["ids"], attention_mask=tensors["attention"], labels=labels
    ).loss
    assert torch.allclose(batch_loss(model, tensors), expected, atol=1e-6)


def test_training_lowers_the_loss_and_changes_only_the_lora_weights():
    model = tiny_lora()
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    before = lora_weights(model)
    lines: list[str] = []
    trained = train(model, steps=30, log=lines.append)
    assert (trained.steps, trained.planned, trained.stopped) == (30, 30, "")
    assert trained.losses[-1] < trained.losses[0]
    assert lines[0].startswith("step 1/30 loss ") and lines[0].endswith(" s/step")
    assert len(lines) == 30
    after = lora_weights(model)
    assert any(not torch.equal(before[n], after[n]) for n in before)
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)


def test_the_same_seed_gives_the_same_adapter_bytes(tmp_path):
    for name in ("a", "b"):
        model = tiny_lora(seed=3)
        train(model, seed=3)
        adapter_save(model, tmp_path / name, base_model="gemma-3-270m")
    for file in ("adapter_config.json", "adapter_model.safetensors"):
        assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes()
    other = tiny_lora(seed=4)
    train(other, seed=4)
    adapter_save(other, tmp_path / "c", base_model="gemma-3-270m")
    assert (tmp_path / "c" / "adapter_model.safetensors").read_bytes() != (
        tmp_path / "a" / "adapter_model.safetensors"
    ).read_bytes()


def test_it_saves_a_float32_peft_adapter_for_the_base_model_by_name(tmp_path):
    model = tiny_lora()
    train(model, steps=1)
    files = adapter_save(model, tmp_path / "out", base_model="gemma-3-270m")
    assert [f.name for f in files] == ["adapter_config.json", "adapter_model.safetensors"]
    config = json.loads((tmp_path / "out" / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "gemma-3-270m"
    assert config["target_modules"] == ["q_proj", "v_proj"]
    assert (config["r"], config["lora_alpha"], config["peft_type"]) == (4, 8, "LORA")
    tensors = load_file(tmp_path / "out" / "adapter_model.safetensors")
    assert {t.dtype for t in tensors.values()} == {torch.float32}
    info = adapter_validate(directory=tmp_path / "out", base_model="google/gemma-3-270m")
    assert (info.rank, info.tensors) == (4, 8)  # 2 layers x 2 modules x (A, B)


def test_it_continues_a_parent_adapter(tmp_path):
    parent = tiny_lora()
    train(parent)
    adapter_save(parent, tmp_path / "parent", base_model="gemma-3-270m")
    parent_weights = {n.replace(".default", ""): p for n, p in lora_weights(parent).items()}

    config = parent_adapter_check(tmp_path / "parent", base_model="gemma-3-270m")
    assert config["r"] == 4
    child = lora_attach(
        tiny_model(),
        parent_adapter=tmp_path / "parent",
        rank=16,  # ignored: the parent's rank and targets are kept
        alpha=1,
        dropout=0,
        targets=["o_proj"],
    )
    loaded = {n.replace(".default", ""): p for n, p in lora_weights(child).items()}
    assert loaded.keys() == parent_weights.keys()
    assert all(torch.equal(loaded[n], parent_weights[n]) for n in loaded)
    assert all(p.requires_grad for n, p in child.named_parameters() if "lora_" in n)
    train(child, steps=2)
    adapter_save(child, tmp_path / "child", base_model="gemma-3-270m")
    assert json.loads((tmp_path / "child" / "adapter_config.json").read_text())["r"] == 4
    trained = load_file(tmp_path / "child" / "adapter_model.safetensors")
    saved = load_file(tmp_path / "parent" / "adapter_model.safetensors")
    assert trained.keys() == saved.keys()
    assert any(not torch.equal(trained[k], saved[k]) for k in saved)


def test_it_refuses_a_parent_adapter_it_cannot_continue(tmp_path):
    with pytest.raises(ValueError, match="has no adapter_config.json"):
        parent_adapter_check(tmp_path, base_model="gemma-3-270m")
    model = tiny_lora()
    adapter_save(model, tmp_path / "p", base_model="other-model")
    with pytest.raises(ValueError, match="trained on 'other-model', not on 'gemma-3-270m'"):
        parent_adapter_check(tmp_path / "p", base_model="gemma-3-270m")


def test_it_refuses_targets_the_model_does_not_have():
    with pytest.raises(ValueError, match="does not have: qkv_proj"):
        tiny_lora(targets=["q_proj", "qkv_proj"])


class Clock:
    """Ten seconds pass each time it is read."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 10
        return self.now


def test_it_stops_before_a_step_that_would_end_past_the_time_limit():
    # Each step reads the clock twice (start, end): steps take 10 s and begin 20 s apart.
    # Step 1 starts at 20 and ends at 30; step 2 would start at 40 and end past 45.
    trained = train(tiny_lora(), steps=5, deadline=45.0, clock=Clock())
    assert (trained.steps, trained.planned) == (1, 5)
    assert trained.stopped == "the time limit leaves no time for step 2 (about 10.0 s)"
    assert len(trained.losses) == 1
    # A limit already past: no step at all (the program then exits 1, saving nothing).
    assert train(tiny_lora(), steps=5, deadline=5.0, clock=Clock()).steps == 0


def test_it_stops_when_the_loss_diverges():
    model = tiny_lora()
    with torch.no_grad():
        next(p for n, p in model.named_parameters() if "lora_B" in n).fill_(float("inf"))
    with pytest.raises(FloatingPointError, match="the loss is nan at step 1: lower --learning"):
        train(model, steps=1)


def test_steps_come_from_the_steps_or_the_epochs():
    assert steps_planned(rows=10, batch_size=4, steps=7, epochs=None) == 7
    assert steps_planned(rows=10, batch_size=4, steps=None, epochs=1.0) == 3
    assert steps_planned(rows=10, batch_size=4, steps=None, epochs=2.5) == 7
    assert steps_planned(rows=1, batch_size=4, steps=None, epochs=0.01) == 1


def test_a_pass_over_the_rows_uses_each_row_once_in_a_seeded_order():
    def first_pass(seed):
        source = batches(SEQUENCES, batch_size=3, seed=seed)
        return [s.ids[1] for batch in (next(source), next(source)) for s in batch]

    assert sorted(first_pass(0)) == [5, 10, 20, 30]
    assert first_pass(0) == first_pass(0)
    assert any(first_pass(0) != first_pass(seed) for seed in range(1, 5))
