"""A trainer's output checked as a LoRA adapter, then installed where the policy server reads it.

What vLLM (and PEFT) load: ``adapter_config.json`` (``peft_type`` LORA, a positive rank ``r``,
``target_modules``) and the weights, ``adapter_model.safetensors`` or ``adapter_model.bin``.
The safetensors header is parsed and every tensor's byte range checked against its dtype and
shape, so a truncated or mislabelled file is refused here, with the reason, instead of failing
later inside the policy server. Installed adapters are immutable: copied (regular files only)
to ``COEVO_ADAPTER_DIR/<name>``, made read-only, and identified by a sha256 over their files.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from coevo.errors import InvalidInput

CONFIG = "adapter_config.json"
SAFETENSORS = "adapter_model.safetensors"
PICKLE = "adapter_model.bin"
# safetensors dtypes and their sizes in bytes.
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
    "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4,
    "I64": 8, "U64": 8, "F64": 8,
}  # fmt: skip
MAX_HEADER_BYTES = 100 * 1024 * 1024


class InvalidAdapter(InvalidInput):
    code = "invalid_adapter"


@dataclass(frozen=True)
class AdapterInfo:
    rank: int
    target_modules: list[str] | str
    base_model: str  # base_model_name_or_path as the trainer wrote it ("" when absent)
    weights: str  # the weights file's name
    tensors: int  # tensors in a safetensors file (0 for a .bin)
    size_bytes: int


def adapter_validate(*, directory: Path, base_model: str) -> AdapterInfo:
    """Check ``directory`` holds a LoRA adapter for ``base_model``; raises InvalidAdapter."""
    if not directory.is_dir():
        raise InvalidAdapter(f"The trainer wrote no output directory ({directory}).")
    _refuse_links(directory)
    config_path = directory / CONFIG
    if not config_path.is_file():
        present = sorted(p.name for p in directory.iterdir())[:20]
        raise InvalidAdapter(
            f"No {CONFIG} in the trainer's output directory (it holds: "
            f"{', '.join(present) or 'nothing'}). A LoRA adapter is what PEFT's "
            "save_pretrained() writes."
        )
    try:
        config = json.loads(config_path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidAdapter(f"{CONFIG} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise InvalidAdapter(f"{CONFIG} must hold a JSON object.")
    peft_type = str(config.get("peft_type") or "")
    if peft_type.upper() != "LORA":
        raise InvalidAdapter(
            f"{CONFIG}: peft_type is {peft_type or 'missing'!r}; the policy server loads LORA "
            "adapters only."
        )
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise InvalidAdapter(
            f"{CONFIG}: r (the LoRA rank) must be a positive integer, not {rank!r}."
        )
    targets = config.get("target_modules")
    if not targets or not isinstance(targets, list | str):
        raise InvalidAdapter(f"{CONFIG}: target_modules must name the modules the adapter changes.")
    trained_for = str(config.get("base_model_name_or_path") or "")
    if trained_for and not _same_model(trained_for, base_model):
        raise InvalidAdapter(
            f"The adapter was trained on {trained_for!r}, but the policy it extends serves "
            f"{base_model!r}: a LoRA only fits the base model it was trained on."
        )
    if (directory / SAFETENSORS).is_file():
        weights, tensors = SAFETENSORS, _safetensors_check(directory / SAFETENSORS)
    elif (directory / PICKLE).is_file():
        if (directory / PICKLE).stat().st_size == 0:
            raise InvalidAdapter(f"{PICKLE} is empty.")
        weights, tensors = PICKLE, 0
    else:
        raise InvalidAdapter(
            f"No weights: the output directory has {CONFIG} but neither {SAFETENSORS} nor {PICKLE}."
        )
    size = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
    return AdapterInfo(
        rank=rank,
        target_modules=targets,
        base_model=trained_for,
        weights=weights,
        tensors=tensors,
        size_bytes=size,
    )


def _same_model(a: str, b: str) -> bool:
    """Hugging Face ids and served names: "google/gemma-3-270m" fits "gemma-3-270m"."""

    def last(name: str) -> str:
        return name.rstrip("/").rsplit("/", 1)[-1].lower()

    return last(a) == last(b)


def _refuse_links(directory: Path) -> None:
    for path in directory.rglob("*"):
        if path.is_symlink():
            raise InvalidAdapter(
                f"The output directory holds a symbolic link ({path.relative_to(directory)}): "
                "an adapter is regular files only."
            )


def _safetensors_check(path: Path) -> int:
    return len(safetensors_header_read(path=path))


@dataclass(frozen=True)
class SafetensorsTensor:
    name: str
    dtype: str  # a key of DTYPE_BYTES
    shape: tuple[int, ...]
    start: int  # the tensor's bytes in the file: [start, end)
    end: int


def safetensors_header_read(*, path: Path) -> list[SafetensorsTensor]:
    """The tensors of a safetensors file, in file order, each one's byte range checked against
    its dtype, its shape and the file (8-byte little-endian header length, then JSON, then the
    data); raises InvalidAdapter. Reads the header only: the caller reads the bytes it needs."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise InvalidAdapter(f"{SAFETENSORS} is truncated ({size} bytes).")
        (length,) = struct.unpack("<Q", head)
        if length > MAX_HEADER_BYTES or 8 + length > size:
            raise InvalidAdapter(
                f"{SAFETENSORS}: its header claims {length} bytes, the file has {size}."
            )
        try:
            header = json.loads(f.read(length))
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidAdapter(f"{SAFETENSORS}: the header is not JSON ({exc}).") from exc
    if not isinstance(header, dict):
        raise InvalidAdapter(f"{SAFETENSORS}: the header must be a JSON object.")
    data_start = 8 + length
    data_bytes = size - data_start
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    if not tensors:
        raise InvalidAdapter(f"{SAFETENSORS} holds no tensors.")
    found = []
    for name, info in tensors.items():
        _tensor_check(name, info, data_bytes)
        begin, end = info["data_offsets"]
        found.append(
            SafetensorsTensor(
                name=name,
                dtype=info["dtype"],
                shape=tuple(info["shape"]),
                start=data_start + begin,
                end=data_start + end,
            )
        )
    return sorted(found, key=lambda t: t.start)


def _tensor_check(name: str, info: Any, data_bytes: int) -> None:
    where = f"{SAFETENSORS}: tensor {name!r}"
    if not isinstance(info, dict):
        raise InvalidAdapter(f"{where}: expected dtype, shape and data_offsets.")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in DTYPE_BYTES:
        raise InvalidAdapter(f"{where}: unknown dtype {dtype!r}.")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise InvalidAdapter(f"{where}: shape must be a list of non-negative integers.")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1] <= data_bytes
    ):
        raise InvalidAdapter(
            f"{where}: data_offsets {offsets!r} fall outside the {data_bytes} data bytes."
        )
    expected = math.prod(shape) * DTYPE_BYTES[dtype]
    if offsets[1] - offsets[0] != expected:
        raise InvalidAdapter(
            f"{where}: {offsets[1] - offsets[0]} bytes for a {dtype} tensor of shape {shape} "
            f"(expected {expected})."
        )


def adapter_dir() -> Path:
    return Path(settings.COEVO_ADAPTER_DIR)


def adapter_install(*, source: Path, name: str) -> tuple[Path, str]:
    """Copy the validated adapter to ``COEVO_ADAPTER_DIR/<name>`` (read-only); returns the
    installed path and its sha256. The copy is made beside the target and renamed into place,
    so the policy server never sees half an adapter."""
    target = adapter_dir() / name
    if target.exists():
        raise InvalidAdapter(f"An adapter named {name} is already installed ({target}).")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.parent / f".{name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    digest = hashlib.sha256()
    try:
        for path in sorted(p for p in source.rglob("*") if p.is_file()):
            rel = path.relative_to(source)
            dest = partial / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)
            digest.update(f"{rel}\0{path.stat().st_size}\0".encode())
            with dest.open("rb") as f:
                for chunk in iter(lambda f=f: f.read(1 << 20), b""):
                    digest.update(chunk)
            os.chmod(dest, 0o444)
        os.replace(partial, target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return target, digest.hexdigest()
