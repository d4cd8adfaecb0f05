"""PEFT LoRA adapters written as GGUF for llama.cpp: synthetic adapters shaped after the shipped
Gemma 3 270M (shapes read from its GGUF) converted and read back with gguf's own reader, every
refusal, and the real llama.cpp loading what was written (and applying it)."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import gguf
import numpy as np
import pytest

from coevo.errors import CoevoError
from coevo.training import gguf_adapter
from coevo.training.adapters import InvalidAdapter
from coevo.training.gguf_adapter import (
    GGUF_ADAPTER,
    adapter_gguf_load_check,
    adapter_gguf_write,
    base_gguf_layout,
    gguf_greedy_text,
)
from tests.support.tiny_trainer import lora_tensors, write_safetensors, write_shaped_adapter
from tests.training.conftest import ATTENTION, GEMMA_MODULES

BASE = "google/gemma-3-270m"
Q = "base_model.model.model.layers.0.self_attn.q_proj"


@pytest.fixture
def write(tmp_path, gemma_shapes, gemma_layout):
    """Write a Gemma-shaped PEFT adapter into tmp_path/<name>; returns its directory."""

    def write(name="peft", modules=ATTENTION, layers=None, seed=None, **kwargs) -> Path:
        out = tmp_path / name
        write_shaped_adapter(
            out,
            base=BASE,
            shapes={m: gemma_shapes[m] for m in modules},
            layers=gemma_layout.block_count if layers is None else layers,
            seed=name.encode() if seed is None else seed,
            **kwargs,
        )
        return out

    return write


def convert(peft: Path, base: Path):
    return adapter_gguf_write(peft_dir=peft, base_gguf=base, out=peft / GGUF_ADAPTER)


def fields(reader: gguf.GGUFReader) -> dict:
    return {name: field.contents() for name, field in reader.fields.items()}


# --- what is written -------------------------------------------------------------------------


def test_it_writes_an_attention_lora_as_llama_cpp_expects_it(write, gemma_gguf, gemma_layout):
    peft = write(rank=8)
    info = convert(peft, gemma_gguf)

    path = peft / GGUF_ADAPTER
    assert info.path == path
    assert (info.modules, info.tensors, info.rank, info.alpha) == (72, 144, 8, 16.0)
    assert info.architecture == "gemma3"
    assert info.size_bytes == path.stat().st_size
    assert info.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert info.base_gguf == str(gemma_gguf)
    assert info.base_gguf_sha256 == hashlib.sha256(gemma_gguf.read_bytes()).hexdigest()
    assert not list(peft.glob(".*.partial"))

    reader = gguf.GGUFReader(path)
    meta = fields(reader)
    assert meta["general.type"] == "adapter"
    assert meta["general.architecture"] == "gemma3"
    assert meta["adapter.type"] == "lora"
    assert meta["adapter.lora.alpha"] == pytest.approx(16.0)
    written = {t.name: t for t in reader.tensors}
    assert len(written) == 144
    expected = lora_tensors(
        {m: gemma_layout.shapes[f"blk.0.{GEMMA_MODULES[m]}.weight"] for m in ATTENTION},
        layers=18,
        rank=8,
        seed=b"peft",
    )
    for layer in (0, 17):
        for module in ATTENTION:
            target = f"blk.{layer}.{GEMMA_MODULES[module]}.weight"
            out_features, in_features = gemma_layout.shapes[target]
            a, b = written[f"{target}.lora_a"], written[f"{target}.lora_b"]
            # ggml's order of dimensions, innermost first: what llama-adapter.cpp checks.
            assert [int(d) for d in a.shape] == [in_features, 8]
            assert [int(d) for d in b.shape] == [8, out_features]
            assert a.tensor_type == b.tensor_type == gguf.GGMLQuantizationType.F32
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            np.testing.assert_array_equal(a.data, expected[f"{prefix}.lora_A.weight"][1])
            np.testing.assert_array_equal(b.data, expected[f"{prefix}.lora_B.weight"][1])


def test_it_maps_the_mlp_projections_too(write, gemma_gguf):
    peft = write(modules=("gate_proj", "up_proj", "down_proj"), layers=2, rank=4)
    info = convert(peft, gemma_gguf)
    assert (info.modules, info.tensors, info.rank) == (6, 12, 4)
    names = {t.name for t in gguf.GGUFReader(peft / GGUF_ADAPTER).tensors}
    assert names == {
        f"blk.{i}.ffn_{p}.weight.lora_{h}" for i in (0, 1) for p in ("gate", "up", "down")
        for h in ("a", "b")
    }  # fmt: skip


@pytest.mark.parametrize("dtype", ["F16", "BF16"])
def test_it_reads_16_bit_weights_exactly_into_float32(write, gemma_gguf, gemma_shapes, dtype):
    peft = write(modules=("q_proj",), layers=1, dtype=dtype)
    convert(peft, gemma_gguf)
    original = lora_tensors({"q_proj": gemma_shapes["q_proj"]}, layers=1, rank=8, seed=b"peft")
    a = original[f"{Q}.lora_A.weight"][1]
    stored = (
        a.astype(np.float16).astype(np.float32)
        if dtype == "F16"
        else ((a.view(np.uint32) >> 16) << 16).view(np.float32)
    )
    written = {t.name: t for t in gguf.GGUFReader(peft / GGUF_ADAPTER).tensors}
    np.testing.assert_array_equal(written["blk.0.attn_q.weight.lora_a"].data, stored)


def test_it_folds_rslora_scaling_into_alpha(write, gemma_gguf):
    # PEFT scales rsLoRA by alpha / sqrt(r); llama.cpp by alpha / r.
    peft = write(modules=("v_proj",), layers=1, rank=8, config={"use_rslora": True})
    info = convert(peft, gemma_gguf)
    assert info.alpha == pytest.approx(16 * math.sqrt(8))
    meta = fields(gguf.GGUFReader(peft / GGUF_ADAPTER))
    assert meta["adapter.lora.alpha"] == pytest.approx(16 * math.sqrt(8))


def test_the_same_adapter_gives_the_same_bytes(write, gemma_gguf):
    one, two = write("one", layers=2, seed=b"same"), write("two", layers=2, seed=b"same")
    assert convert(one, gemma_gguf).sha256 == convert(two, gemma_gguf).sha256


def test_the_base_layout_is_read_once_per_file_version(gemma_gguf):
    assert base_gguf_layout(path=gemma_gguf) is base_gguf_layout(path=gemma_gguf)


# --- refusals --------------------------------------------------------------------------------


def add(name, shape):
    return lambda tensors: tensors.update({name: (shape, np.zeros(shape, np.float32))})


def rename(old, new):
    def change(tensors):
        for key in list(tensors):
            tensors[key.replace(old, new)] = tensors.pop(key)

    return change


def drop(name):
    return lambda tensors: tensors.pop(name)


def set_a(shape, value=0.0):
    return lambda tensors: tensors.update(
        {f"{Q}.lora_A.weight": (shape, np.full(shape, value, np.float32))}
    )


REFUSALS = {
    "dora": ({"use_dora": True}, None, "DoRA"),
    "dora-vector": ({}, add(f"{Q}.lora_magnitude_vector", [1024]), "DoRA magnitude vector"),
    "bias-config": ({"bias": "all"}, None, "bias='all'"),
    "bias-tensor": ({}, add(f"{Q}.bias", [1024]), "is a bias"),
    "modules-to-save": ({"modules_to_save": ["lm_head"]}, None, "modules_to_save"),
    "embedding-lora": (
        {},
        add("base_model.model.model.embed_tokens.lora_embedding_A", [8, 4]),
        "changes the embeddings",
    ),
    "embedding-weights": (
        {},
        add("base_model.model.model.embed_tokens.weight", [4, 640]),
        "changes the embeddings",
    ),
    "lm-head": ({}, rename("model.layers.0.self_attn.q_proj", "lm_head"), "not a projection"),
    "rank-pattern": ({"rank_pattern": {"q_proj": 4}}, None, "rank_pattern"),
    "alpha-pattern": ({"alpha_pattern": {"q_proj": 4}}, None, "alpha_pattern"),
    "fan-in-fan-out": ({"fan_in_fan_out": True}, None, "fan_in_fan_out"),
    "rank-not-config": ({"r": 4}, None, r"needs \[4, 640\]"),
    "wrong-in-features": ({}, set_a([8, 320]), r"has shape \[8, 320\]"),
    "unknown-module": ({}, rename("q_proj", "qkv_proj"), "not a projection of a gemma3 block"),
    "past-last-block": ({}, rename("layers.0.", "layers.18."), r"has 18 blocks \(0 to 17\)"),
    "missing-b": ({}, drop(f"{Q}.lora_B.weight"), "no lora_A/lora_B partner"),
    "nan": ({}, set_a([8, 640], float("nan")), "NaN or infinite"),
    "no-alpha": ({"lora_alpha": None}, None, "lora_alpha must be a positive number"),
    "not-peft-name": ({}, rename("base_model.model.", ""), "is not a PEFT LoRA tensor"),
    "not-lora": ({"peft_type": "IA3"}, None, "does not describe a LoRA"),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_it_refuses_what_llama_cpp_would_not_apply_as_peft_does(
    case, tmp_path, gemma_gguf, gemma_shapes
):
    config, change, message = REFUSALS[case]
    peft = tmp_path / "peft"
    shapes = {"q_proj": gemma_shapes["q_proj"]}
    write_shaped_adapter(peft, base=BASE, shapes=shapes, layers=1, config=config)
    tensors = lora_tensors(shapes, layers=1, rank=8, seed=b"")
    if change is not None:
        change(tensors)
        write_safetensors(peft / "adapter_model.safetensors", tensors)
    with pytest.raises(InvalidAdapter, match=message):
        convert(peft, gemma_gguf)
    assert not (peft / GGUF_ADAPTER).exists()
    assert not list(peft.glob(".*.partial"))


def test_it_refuses_a_dtype_it_does_not_read(tmp_path, gemma_gguf, gemma_shapes):
    write_shaped_adapter(
        tmp_path, base=BASE, shapes={"q_proj": gemma_shapes["q_proj"]}, layers=1, dtype="F64"
    )
    with pytest.raises(InvalidAdapter, match="is F64; the converter reads F32, F16 and BF16"):
        convert(tmp_path, gemma_gguf)


def test_it_refuses_pickled_weights(write, gemma_gguf):
    peft = write(layers=1)
    (peft / "adapter_model.safetensors").rename(peft / "adapter_model.bin")
    with pytest.raises(InvalidAdapter, match=r"only adapter_model.bin, a pickle"):
        convert(peft, gemma_gguf)


def test_it_refuses_weights_over_the_size_bound_before_reading_them(write, gemma_gguf, monkeypatch):
    peft = write(layers=1)
    monkeypatch.setattr(gguf_adapter, "MAX_WEIGHTS_BYTES", 1000)
    with pytest.raises(InvalidAdapter, match="over the 1,000 a LoRA for llama.cpp may have"):
        convert(peft, gemma_gguf)


def fake_base(path: Path, *, arch: str, kind: str = "model") -> Path:
    """A tiny GGUF with one 2-D weight, as a base model of ``arch`` (or another ``kind``)."""
    writer = gguf.GGUFWriter(path=None, arch=arch)
    writer.add_type(kind)
    writer.add_block_count(1)
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((4, 4), np.float32))
    writer.write_header_to_file(path)
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_it_refuses_a_base_whose_projections_llama_cpp_converts_otherwise(tmp_path):
    base = fake_base(tmp_path / "llama.gguf", arch="llama")
    peft = tmp_path / "peft"
    write_shaped_adapter(peft, base=BASE, shapes={"q_proj": (4, 4)}, layers=1, rank=2)
    with pytest.raises(InvalidAdapter, match=r"'llama' model.*Serve this base model from a vLLM"):
        convert(peft, base)


def test_a_small_base_of_a_supported_architecture_is_read_from_its_own_file(tmp_path):
    layout = base_gguf_layout(path=fake_base(tmp_path / "qwen.gguf", arch="qwen2"))
    assert (layout.architecture, layout.block_count) == ("qwen2", 1)
    assert layout.shapes == {"blk.0.attn_q.weight": (4, 4)}


def test_it_refuses_a_base_that_is_not_a_base_model(tmp_path):
    with pytest.raises(CoevoError, match="is a GGUF adapter, not a base model"):
        base_gguf_layout(path=fake_base(tmp_path / "a.gguf", arch="gemma3", kind="adapter"))
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(CoevoError, match="is not a GGUF model file"):
        base_gguf_layout(path=tmp_path / "junk.gguf")
    with pytest.raises(CoevoError, match="cannot be read"):
        base_gguf_layout(path=tmp_path / "missing.gguf")


# --- the real llama.cpp ----------------------------------------------------------------------


def test_llama_cpp_applies_what_was_written(write, gemma_gguf):
    base_text = gguf_greedy_text(model=gemma_gguf)
    assert base_text.strip()

    # A fresh PEFT adapter has B = 0: it changes nothing, so the greedy text is the base's.
    zero = convert(write("zero", b_scale=0.0), gemma_gguf)
    assert adapter_gguf_load_check(base_gguf=gemma_gguf, adapter_gguf=zero.path) == base_text

    # Large random A and B change every attention output: llama.cpp applied the adapter.
    large = convert(write("large", a_scale=1.0, b_scale=1.0), gemma_gguf)
    assert adapter_gguf_load_check(base_gguf=gemma_gguf, adapter_gguf=large.path) != base_text


def test_the_load_check_refuses_a_file_llama_cpp_cannot_load_with_its_reason(tmp_path, gemma_gguf):
    # Written past the converter's checks: lora_a's inner dimension is not the base's 640.
    writer = gguf.GGUFWriter(path=None, arch="gemma3")
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, 16.0)
    writer.add_tensor("blk.0.attn_q.weight.lora_a", np.zeros((8, 320), np.float32))
    writer.add_tensor("blk.0.attn_q.weight.lora_b", np.zeros((1024, 8), np.float32))
    writer.write_header_to_file(tmp_path / "bad.gguf")
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(
        InvalidAdapter, match="llama.cpp refused.*'blk.0.attn_q.weight' has incorrect shape"
    ):
        adapter_gguf_load_check(base_gguf=gemma_gguf, adapter_gguf=tmp_path / "bad.gguf")


def test_the_load_check_refuses_a_truncated_file(write, gemma_gguf, tmp_path):
    whole = convert(write(layers=2), gemma_gguf).path.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(InvalidAdapter, match="not within the file bounds"):
        adapter_gguf_load_check(base_gguf=gemma_gguf, adapter_gguf=tmp_path / "cut.gguf")


def test_the_load_check_ends_at_its_timeout(write, gemma_gguf):
    adapter = convert(write(layers=1), gemma_gguf).path
    with pytest.raises(InvalidAdapter, match=r"and answer within 0.2 s"):
        adapter_gguf_load_check(base_gguf=gemma_gguf, adapter_gguf=adapter, timeout_s=0.2)
