"""A trainer's output checked as a LoRA adapter (config, weights, the safetensors header and
every tensor's byte range) and installed, read-only, under COEVO_ADAPTER_DIR."""

from __future__ import annotations

import json
import os
import shutil
import stat
import struct
from pathlib import Path

import numpy as np
import pytest

from coevo.training.adapters import (
    PICKLE,
    SAFETENSORS,
    InvalidAdapter,
    adapter_install,
    adapter_validate,
    safetensors_header_read,
)
from tests.support.tiny_trainer import write_adapter, write_safetensors

BASE = "gemma-3-270m"


@pytest.fixture(autouse=True)
def _adapter_dir(settings, tmp_path):
    settings.COEVO_ADAPTER_DIR = tmp_path / "adapters"


@pytest.fixture
def adapter(tmp_path) -> Path:
    out = tmp_path / "out"
    write_adapter(out, base=f"google/{BASE}", seed=b"some data")
    return out


def config_of(directory: Path) -> dict:
    return json.loads((directory / "adapter_config.json").read_text())


def set_config(directory: Path, **changes) -> None:
    config = config_of(directory)
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (directory / "adapter_config.json").write_text(json.dumps(config))


def raw_safetensors(path: Path, header: object, data: bytes, *, claimed: int | None = None) -> None:
    """A safetensors file with a given header and data section (possibly wrong on purpose)."""
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    length = len(encoded) if claimed is None else claimed
    path.write_bytes(struct.pack("<Q", length) + encoded + data)


def validate(directory: Path, base_model: str = BASE):
    return adapter_validate(directory=directory, base_model=base_model)


# --- validation: the config --------------------------------------------------------------


def test_it_accepts_a_lora_adapter_and_describes_it(adapter):
    info = validate(adapter)
    assert info.rank == 4
    assert info.target_modules == ["q_proj", "v_proj"]
    assert info.base_model == f"google/{BASE}"
    assert info.weights == SAFETENSORS
    assert info.tensors == 2
    assert info.size_bytes == sum(p.stat().st_size for p in adapter.iterdir())


def test_it_refuses_a_missing_output_directory(tmp_path):
    with pytest.raises(InvalidAdapter, match="wrote no output directory"):
        validate(tmp_path / "never-written")


def test_it_refuses_a_directory_without_a_config_and_says_what_it_holds(adapter):
    (adapter / "adapter_config.json").unlink()
    with pytest.raises(InvalidAdapter, match=r"No adapter_config\.json.*adapter_model"):
        validate(adapter)


def test_it_refuses_an_empty_directory(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidAdapter, match="it holds: nothing"):
        validate(tmp_path / "empty")


def test_it_refuses_a_config_that_is_not_json(adapter):
    (adapter / "adapter_config.json").write_text("{'peft_type': 'LORA'")
    with pytest.raises(InvalidAdapter, match="not valid JSON"):
        validate(adapter)


def test_it_refuses_a_config_that_is_not_an_object(adapter):
    (adapter / "adapter_config.json").write_text('["LORA"]')
    with pytest.raises(InvalidAdapter, match="JSON object"):
        validate(adapter)


@pytest.mark.parametrize("peft_type", ["IA3", "PREFIX_TUNING", None])
def test_it_refuses_a_peft_type_other_than_lora(adapter, peft_type):
    set_config(adapter, peft_type=peft_type)
    with pytest.raises(InvalidAdapter, match="LORA adapters only"):
        validate(adapter)


def test_it_accepts_the_peft_type_in_lower_case(adapter):
    set_config(adapter, peft_type="lora")
    assert validate(adapter).rank == 4


@pytest.mark.parametrize("rank", [0, -4, "8", 8.0, True, None])
def test_it_refuses_a_rank_that_is_not_a_positive_integer(adapter, rank):
    config = config_of(adapter)
    config["r"] = rank
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidAdapter, match="positive integer"):
        validate(adapter)


@pytest.mark.parametrize("targets", [None, [], "", 3, {"q_proj": True}])
def test_it_refuses_missing_target_modules(adapter, targets):
    config = config_of(adapter)
    config.pop("target_modules")
    if targets is not None:
        config["target_modules"] = targets
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(InvalidAdapter, match="target_modules"):
        validate(adapter)


def test_it_accepts_target_modules_as_a_string(adapter):
    set_config(adapter, target_modules="all-linear")
    assert validate(adapter).target_modules == "all-linear"


def test_it_refuses_an_adapter_trained_on_another_base_model(adapter):
    with pytest.raises(InvalidAdapter, match="trained on 'google/gemma-3-270m'"):
        validate(adapter, base_model="meta-llama/Llama-3.2-1B")


@pytest.mark.parametrize(
    "base_model",
    ["gemma-3-270m", "google/gemma-3-270m", "Google/Gemma-3-270M", "/models/gemma-3-270m/"],
)
def test_it_matches_hugging_face_ids_with_served_names(adapter, base_model):
    assert validate(adapter, base_model=base_model).base_model == "google/gemma-3-270m"


def test_it_accepts_an_adapter_that_does_not_name_its_base_model(adapter):
    set_config(adapter, base_model_name_or_path=None)
    assert validate(adapter, base_model="anything").base_model == ""


# --- validation: the weights ----------------------------------------------------------------


def test_it_refuses_an_adapter_without_weights(adapter):
    (adapter / SAFETENSORS).unlink()
    with pytest.raises(InvalidAdapter, match="No weights"):
        validate(adapter)


def test_it_accepts_pickled_weights(adapter):
    (adapter / SAFETENSORS).unlink()
    (adapter / PICKLE).write_bytes(b"PK\x03\x04 torch.save output")
    info = validate(adapter)
    assert (info.weights, info.tensors) == (PICKLE, 0)


def test_it_refuses_empty_pickled_weights(adapter):
    (adapter / SAFETENSORS).unlink()
    (adapter / PICKLE).write_bytes(b"")
    with pytest.raises(InvalidAdapter, match="adapter_model.bin is empty"):
        validate(adapter)


def test_it_prefers_the_safetensors_file_and_checks_it(adapter):
    (adapter / PICKLE).write_bytes(b"fine")
    (adapter / SAFETENSORS).write_bytes(b"\x01\x02")
    with pytest.raises(InvalidAdapter, match="truncated"):
        validate(adapter)


def test_it_refuses_a_truncated_safetensors_file(adapter):
    whole = (adapter / SAFETENSORS).read_bytes()
    (adapter / SAFETENSORS).write_bytes(whole[:5])
    with pytest.raises(InvalidAdapter, match=r"truncated \(5 bytes\)"):
        validate(adapter)


def test_it_refuses_a_safetensors_file_cut_inside_its_data(adapter):
    whole = (adapter / SAFETENSORS).read_bytes()
    (adapter / SAFETENSORS).write_bytes(whole[:-4])
    with pytest.raises(InvalidAdapter, match="fall outside"):
        validate(adapter)


def test_it_refuses_a_header_length_beyond_the_file(adapter):
    raw_safetensors(adapter / SAFETENSORS, {}, b"", claimed=4096)
    with pytest.raises(InvalidAdapter, match="header claims 4096 bytes"):
        validate(adapter)


def test_it_refuses_a_huge_header_length(adapter):
    (adapter / SAFETENSORS).write_bytes(struct.pack("<Q", 2**63) + b"{}")
    with pytest.raises(InvalidAdapter, match="header claims"):
        validate(adapter)


def test_it_refuses_a_header_that_is_not_json(adapter):
    body = b"not json"
    (adapter / SAFETENSORS).write_bytes(struct.pack("<Q", len(body)) + body)
    with pytest.raises(InvalidAdapter, match="header is not JSON"):
        validate(adapter)


def test_it_refuses_a_header_that_is_not_an_object(adapter):
    raw_safetensors(adapter / SAFETENSORS, [1, 2], b"")
    with pytest.raises(InvalidAdapter, match="header must be a JSON object"):
        validate(adapter)


def test_it_refuses_a_file_with_only_metadata(adapter):
    raw_safetensors(adapter / SAFETENSORS, {"__metadata__": {"format": "pt"}}, b"")
    with pytest.raises(InvalidAdapter, match="holds no tensors"):
        validate(adapter)


def test_it_refuses_a_tensor_whose_byte_range_lies_beyond_the_data(adapter):
    header = {"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}
    raw_safetensors(adapter / SAFETENSORS, header, b"\0" * 8)
    with pytest.raises(InvalidAdapter, match=r"'w': data_offsets \[8, 16\] fall outside the 8"):
        validate(adapter)


@pytest.mark.parametrize("offsets", [[4, 0], [-4, 4], [0], "0-8", [0, 8.0]])
def test_it_refuses_malformed_data_offsets(adapter, offsets):
    header = {"w": {"dtype": "F32", "shape": [2], "data_offsets": offsets}}
    raw_safetensors(adapter / SAFETENSORS, header, b"\0" * 8)
    with pytest.raises(InvalidAdapter, match="data_offsets"):
        validate(adapter)


def test_it_refuses_a_tensor_whose_bytes_do_not_match_its_dtype_and_shape(adapter):
    # A 2×2 float32 tensor is 16 bytes, not 8 (e.g. written as F16 but labelled F32).
    header = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 8]}}
    raw_safetensors(adapter / SAFETENSORS, header, b"\0" * 8)
    with pytest.raises(
        InvalidAdapter, match=r"8 bytes for a F32 tensor of shape \[2, 2\] \(expected 16\)"
    ):
        validate(adapter)


def test_it_accepts_each_dtype_at_its_own_size(adapter):
    header = {
        "a": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]},
        "b": {"dtype": "I64", "shape": [1], "data_offsets": [8, 16]},
        "c": {"dtype": "U8", "shape": [], "data_offsets": [16, 17]},
    }
    raw_safetensors(adapter / SAFETENSORS, header, b"\0" * 17)
    assert validate(adapter).tensors == 3


def test_it_refuses_an_unknown_dtype(adapter):
    header = {"w": {"dtype": "F33", "shape": [2], "data_offsets": [0, 8]}}
    raw_safetensors(adapter / SAFETENSORS, header, b"\0" * 8)
    with pytest.raises(InvalidAdapter, match="unknown dtype 'F33'"):
        validate(adapter)


@pytest.mark.parametrize("shape", [[-1], [2.0], "2", None])
def test_it_refuses_a_shape_that_is_not_a_list_of_sizes(adapter, shape):
    header = {"w": {"dtype": "F32", "shape": shape, "data_offsets": [0, 8]}}
    raw_safetensors(adapter / SAFETENSORS, header, b"\0" * 8)
    with pytest.raises(InvalidAdapter, match="shape must be a list"):
        validate(adapter)


def test_it_refuses_a_tensor_entry_that_is_not_an_object(adapter):
    raw_safetensors(adapter / SAFETENSORS, {"w": [0, 8]}, b"\0" * 8)
    with pytest.raises(InvalidAdapter, match="expected dtype, shape and data_offsets"):
        validate(adapter)


def test_it_accepts_the_safetensors_files_the_test_trainer_writes(tmp_path):
    write_safetensors(tmp_path / "w.safetensors", {"x": ([3], [1.0, 2.0, 3.0])})
    (tmp_path / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 1, "target_modules": ["q"]})
    )
    (tmp_path / "w.safetensors").rename(tmp_path / SAFETENSORS)
    assert validate(tmp_path).tensors == 1


def test_the_header_gives_each_tensors_bytes_in_the_file(tmp_path):
    path = tmp_path / SAFETENSORS
    write_safetensors(path, {"b": ([2], [3.0, 4.0]), "a": ([1, 3], [0.5, 1.5, 2.5])}, dtype="F16")
    tensors = safetensors_header_read(path=path)
    assert [(t.name, t.dtype, t.shape) for t in tensors] == [
        ("b", "F16", (2,)),
        ("a", "F16", (1, 3)),
    ]  # file order
    raw = path.read_bytes()
    values = [np.frombuffer(raw[t.start : t.end], "<f2").tolist() for t in tensors]
    assert values == [[3.0, 4.0], [0.5, 1.5, 2.5]]


def test_it_refuses_a_symbolic_link(adapter, tmp_path):
    secret = tmp_path / "elsewhere.txt"
    secret.write_text("not part of the adapter")
    (adapter / "README.md").symlink_to(secret)
    with pytest.raises(InvalidAdapter, match=r"symbolic link \(README\.md\)"):
        validate(adapter)


def test_it_refuses_symlinked_weights(adapter, tmp_path):
    real = tmp_path / "weights.safetensors"
    (adapter / SAFETENSORS).rename(real)
    (adapter / SAFETENSORS).symlink_to(real)
    with pytest.raises(InvalidAdapter, match="symbolic link"):
        validate(adapter)


def test_it_refuses_a_symlink_in_a_subdirectory(adapter, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (adapter / "checkpoint").mkdir()
    (adapter / "checkpoint" / "shared").symlink_to(elsewhere)
    with pytest.raises(InvalidAdapter, match=r"checkpoint/shared"):
        validate(adapter)


# --- install ---------------------------------------------------------------------------------


def test_it_installs_a_read_only_copy_under_the_adapter_dir(adapter, settings):
    (adapter / "logs").mkdir()
    (adapter / "logs" / "loss.txt").write_text("0.5\n")
    target, sha256 = adapter_install(source=adapter, name="base-tiny-1")

    assert target == Path(settings.COEVO_ADAPTER_DIR) / "base-tiny-1"
    assert len(sha256) == 64
    copied = sorted(p.relative_to(target) for p in target.rglob("*") if p.is_file())
    assert copied == sorted(p.relative_to(adapter) for p in adapter.rglob("*") if p.is_file())
    for rel in copied:
        assert (target / rel).read_bytes() == (adapter / rel).read_bytes()
        mode = stat.S_IMODE((target / rel).stat().st_mode)
        assert mode == 0o444, (rel, oct(mode))
    assert validate(target).tensors == 2
    assert not list(target.parent.glob(".*.partial"))


def test_it_refuses_to_install_over_an_existing_adapter(adapter):
    target, _ = adapter_install(source=adapter, name="taken")
    before = (target / SAFETENSORS).read_bytes()
    other = adapter.parent / "other"
    write_adapter(other, base=BASE, seed=b"other data")
    with pytest.raises(InvalidAdapter, match="already installed"):
        adapter_install(source=other, name="taken")
    assert (target / SAFETENSORS).read_bytes() == before


def test_its_sha256_depends_on_the_content_only(adapter, tmp_path):
    twin = tmp_path / "twin"
    shutil.copytree(adapter, twin)
    different = tmp_path / "different"
    write_adapter(different, base=f"google/{BASE}", seed=b"other data")

    _, first = adapter_install(source=adapter, name="one")
    _, again = adapter_install(source=twin, name="two")
    _, other = adapter_install(source=different, name="three")
    assert first == again
    assert other != first


def test_its_sha256_covers_file_names(adapter, tmp_path):
    renamed = tmp_path / "renamed"
    shutil.copytree(adapter, renamed)
    (renamed / SAFETENSORS).rename(renamed / "weights.safetensors")
    _, first = adapter_install(source=adapter, name="one")
    _, second = adapter_install(source=renamed, name="two")
    assert first != second


def test_it_leaves_no_partial_copy_when_the_copy_fails(adapter, settings, monkeypatch):
    copyfile = shutil.copyfile
    copied: list[str] = []

    def failing_copyfile(src, dst, *args, **kwargs):
        if copied:
            raise OSError(28, "No space left on device")
        copied.append(str(src))
        return copyfile(src, dst, *args, **kwargs)

    monkeypatch.setattr(shutil, "copyfile", failing_copyfile)
    with pytest.raises(OSError, match="No space left"):
        adapter_install(source=adapter, name="half")
    monkeypatch.undo()

    root = Path(settings.COEVO_ADAPTER_DIR)
    assert copied, "the first file was copied before the failure"
    assert os.listdir(root) == []
    # The name is free again: a retry installs it.
    target, _ = adapter_install(source=adapter, name="half")
    assert target.is_dir()


def test_it_replaces_a_partial_copy_left_by_a_crash(adapter, settings):
    root = Path(settings.COEVO_ADAPTER_DIR)
    stale = root / ".again.partial"
    stale.mkdir(parents=True)
    (stale / "junk.bin").write_bytes(b"half an adapter")
    target, _ = adapter_install(source=adapter, name="again")
    assert not (target / "junk.bin").exists()
    assert sorted(os.listdir(root)) == ["again"]
