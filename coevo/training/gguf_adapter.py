"""A PEFT LoRA adapter rewritten as the GGUF LoRA that llama.cpp loads, and a real load check.

What llama.cpp expects (src/llama-adapter.cpp, convert_lora_to_gguf.py; llama-cpp-python
0.3.36): metadata ``general.type = adapter``, ``general.architecture`` equal to the base
model's, ``adapter.type = lora`` and ``adapter.lora.alpha``; for every adapted base weight
``W`` (``blk.{i}.attn_q.weight``...), two tensors ``W.lora_a`` and ``W.lora_b``. In ggml's
order of dimensions (innermost first) the base weight is ``[in, out]``, ``lora_a`` must be
``[in, r]`` and ``lora_b`` ``[r, out]``: exactly PEFT's ``lora_A`` ``(r, in)`` and ``lora_B``
``(out, r)`` as row-major arrays, so they are written untransposed. llama.cpp adds
``(alpha / r) * B @ A @ x``, with ``r`` read from ``lora_b``: PEFT's own scaling, and
rsLoRA's ``alpha / sqrt(r)`` once alpha is written as ``alpha * sqrt(r)``.

The base model's architecture, block count and weight shapes come from its GGUF file, and
PEFT's module names (``base_model.model.model.layers.3.self_attn.q_proj``) are mapped with the
``gguf`` package's tensor-name map for that architecture. Anything llama.cpp would apply
differently from PEFT is refused here, with the reason, rather than served wrong.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from coevo.errors import CoevoError
from coevo.training.adapters import (
    CONFIG,
    PICKLE,
    SAFETENSORS,
    InvalidAdapter,
    SafetensorsTensor,
    safetensors_header_read,
)
from coevo.training.process import trainer_environment

if TYPE_CHECKING:
    import gguf

GGUF_ADAPTER = "adapter.gguf"
MAX_CONFIG_BYTES = 1024 * 1024
# A LoRA is a few MB to a few hundred; past this it is not one (or not one worth serving on a CPU).
MAX_WEIGHTS_BYTES = 2 * 1024**3
# Architectures whose attention and MLP projections llama.cpp's convert_hf_to_gguf.py only
# renames (conversion/gemma.py and qwen.py change norms alone). Llama-family models are not
# here: their q/k weights are permuted on conversion, and a LoRA would have to be too.
SUPPORTED_ARCHITECTURES = frozenset({"gemma", "gemma2", "gemma3", "qwen2", "qwen3"})
PEFT_PREFIX = "base_model.model."
_LAYER = re.compile(r"\.layers\.(\d+)\.")
LORA_SUFFIXES = {".lora_A.weight": "a", ".lora_B.weight": "b"}
DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}
# Config entries that would make PEFT compute something llama.cpp's LoRA does not: each key,
# when set, and why it is refused.
UNSUPPORTED_CONFIG = {
    "use_dora": "DoRA (weight-decomposed LoRA) adds a magnitude vector llama.cpp does not apply",
    "modules_to_save": "fully trained modules (modules_to_save) are not a LoRA llama.cpp loads",
    "trainable_token_indices": "trained token embeddings are not a LoRA llama.cpp loads",
    "rank_pattern": "per-module ranks (rank_pattern) are not supported by this converter",
    "alpha_pattern": "per-module alphas (alpha_pattern): llama.cpp has one alpha per adapter",
    "fan_in_fan_out": "fan_in_fan_out weights (GPT-2 style Conv1D) are stored transposed",
    "lora_bias": "a bias on lora_B is not applied by llama.cpp",
    "target_parameters": "LoRA on raw parameters (target_parameters) is not a projection LoRA",
    "alora_invocation_tokens": "activated LoRA (aLoRA) is not supported by this converter",
}
LOAD_CHECK_TIMEOUT_S = 60
LOAD_CHECK_PROMPT = "The capital of France is"
LOAD_CHECK_TOKENS = 8


@dataclass(frozen=True)
class BaseLayout:
    """What a LoRA must fit, read from the base model's GGUF file."""

    path: str
    sha256: str
    architecture: str
    block_count: int
    # Every 2-D weight: (out_features, in_features), the orientation PEFT's tensors use.
    shapes: dict[str, tuple[int, int]]


@dataclass(frozen=True)
class GgufAdapterInfo:
    path: Path
    sha256: str
    size_bytes: int
    architecture: str
    modules: int  # base weights the adapter changes
    tensors: int  # tensors written: a lora_a and a lora_b per module
    rank: int
    alpha: float  # as written to adapter.lora.alpha (rsLoRA's already folded in)
    base_gguf: str
    base_gguf_sha256: str


def base_gguf_layout(*, path: Path) -> BaseLayout:
    """The base model's architecture, block count and weight shapes (cached per file version:
    gguf's reader walks the whole vocabulary, several seconds for Gemma 3's 262k tokens)."""
    try:
        stat = path.stat()
    except OSError as exc:
        raise CoevoError(f"The base model's GGUF file {path} cannot be read: {exc}.") from exc
    return _layout(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _layout(path: str, size: int, mtime_ns: int) -> BaseLayout:
    try:
        reader = _gguf().GGUFReader(path)
    except (ValueError, OSError) as exc:
        raise CoevoError(f"{path} is not a GGUF model file: {exc}") from exc

    def field(key: str) -> Any:
        found = reader.get_field(key)
        return None if found is None else found.contents()

    kind = field("general.type")
    if kind not in (None, "model"):
        raise CoevoError(f"{path} is a GGUF {kind}, not a base model.")
    architecture = field("general.architecture")
    block_count = field(f"{architecture}.block_count")
    if not isinstance(architecture, str) or not isinstance(block_count, int):
        raise CoevoError(f"{path} names no architecture and block count: not a base model.")
    shapes = {
        t.name: (int(t.shape[1]), int(t.shape[0])) for t in reader.tensors if len(t.shape) == 2
    }
    return BaseLayout(
        path=path,
        sha256=_sha256(Path(path)),
        architecture=architecture,
        block_count=block_count,
        shapes=shapes,
    )


def adapter_gguf_write(*, peft_dir: Path, base_gguf: Path, out: Path) -> GgufAdapterInfo:
    """Write the PEFT adapter in ``peft_dir`` as a GGUF LoRA for ``base_gguf`` at ``out``
    (float32, whatever the adapter's F32/F16/BF16), after checking that every tensor maps to
    a base weight of the right shape; raises InvalidAdapter with the reason otherwise."""
    config = _config_read(peft_dir)
    rank, alpha = config["r"], float(config["lora_alpha"])
    if config.get("use_rslora"):
        # PEFT scales rsLoRA by alpha / sqrt(r); llama.cpp scales by alpha / r.
        alpha *= math.sqrt(rank)
    weights = peft_dir / SAFETENSORS
    if not weights.is_file():
        hint = (
            f" (only {PICKLE}, a pickle coevo does not open)"
            if (peft_dir / PICKLE).exists()
            else ""
        )
        raise InvalidAdapter(
            f"No {SAFETENSORS} in the adapter{hint}: save it with PEFT's "
            "save_pretrained(safe_serialization=True), the default."
        )
    size = weights.stat().st_size
    if size > MAX_WEIGHTS_BYTES:
        raise InvalidAdapter(
            f"{SAFETENSORS} is {size:,} bytes, over the {MAX_WEIGHTS_BYTES:,} a LoRA for "
            "llama.cpp may have here: lower the rank or the target modules."
        )
    gguf = _gguf()
    layout = base_gguf_layout(path=base_gguf)
    if layout.architecture not in SUPPORTED_ARCHITECTURES:
        raise InvalidAdapter(
            f"The base model is a {layout.architecture!r} model; coevo converts LoRAs for "
            f"{', '.join(sorted(SUPPORTED_ARCHITECTURES))} only (llama.cpp permutes other "
            "architectures' projections on conversion, and a LoRA would need the same). Serve "
            "this base model from a vLLM endpoint to train adapters for it."
        )
    pairs = _pairs(safetensors_header_read(path=weights), layout)
    arrays: dict[str, np.ndarray] = {}
    with weights.open("rb") as f:
        for target, (a, b) in sorted(pairs.items()):
            out_features, in_features = layout.shapes[target]
            for tensor, expected, suffix in (
                (a, (rank, in_features), "lora_a"),
                (b, (out_features, rank), "lora_b"),
            ):
                if tensor.shape != expected:
                    raise InvalidAdapter(
                        f"{SAFETENSORS}: {tensor.name} has shape {list(tensor.shape)}, but rank "
                        f"{rank} on {target} {list(layout.shapes[target])} (out, in) needs "
                        f"{list(expected)}: the adapter does not fit this base model or its "
                        "own r."
                    )
                arrays[f"{target}.{suffix}"] = _tensor_read(f, tensor)
    partial = out.with_name(f".{out.name}.partial")
    writer = gguf.GGUFWriter(path=None, arch=layout.architecture)
    try:
        writer.add_type(gguf.GGUFType.ADAPTER)
        writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
        writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
        for name, array in arrays.items():
            writer.add_tensor(name, array)
        writer.write_header_to_file(partial)
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(partial, out)
    except BaseException:
        writer.close()
        partial.unlink(missing_ok=True)
        raise
    return GgufAdapterInfo(
        path=out,
        sha256=_sha256(out),
        size_bytes=out.stat().st_size,
        architecture=layout.architecture,
        modules=len(pairs),
        tensors=len(arrays),
        rank=rank,
        alpha=alpha,
        base_gguf=str(base_gguf),
        base_gguf_sha256=layout.sha256,
    )


def _config_read(peft_dir: Path) -> dict[str, Any]:
    path = peft_dir / CONFIG
    if not path.is_file():
        raise InvalidAdapter(f"No {CONFIG} in {peft_dir}: a LoRA adapter is what PEFT writes.")
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise InvalidAdapter(f"{CONFIG} is over {MAX_CONFIG_BYTES:,} bytes: not a PEFT config.")
    try:
        config = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidAdapter(f"{CONFIG} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict) or str(config.get("peft_type", "")).upper() != "LORA":
        raise InvalidAdapter(f"{CONFIG} does not describe a LoRA adapter (peft_type LORA).")
    rank, alpha = config.get("r"), config.get("lora_alpha")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise InvalidAdapter(f"{CONFIG}: r must be a positive integer, not {rank!r}.")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or not alpha > 0:
        raise InvalidAdapter(
            f"{CONFIG}: lora_alpha must be a positive number, not {alpha!r} (llama.cpp scales "
            "the adapter by lora_alpha / r)."
        )
    for key, why in UNSUPPORTED_CONFIG.items():
        if config.get(key):
            raise InvalidAdapter(f"{CONFIG} sets {key}: {why}. Train a plain LoRA instead.")
    if config.get("bias", "none") != "none":
        raise InvalidAdapter(
            f"{CONFIG} sets bias={config['bias']!r}: llama.cpp's LoRA changes weights, not "
            "biases. Train with bias='none' (PEFT's default)."
        )
    return config


def _pairs(
    tensors: list[SafetensorsTensor], layout: BaseLayout
) -> dict[str, tuple[SafetensorsTensor, SafetensorsTensor]]:
    """Each base weight the adapter changes, with its (lora_A, lora_B) tensors."""
    gguf = _gguf()
    names = gguf.get_tensor_name_map(_arch(layout.architecture), layout.block_count)
    halves: dict[str, dict[str, SafetensorsTensor]] = {}
    for tensor in tensors:
        name = tensor.name
        if tensor.dtype not in DTYPES:
            raise InvalidAdapter(
                f"{SAFETENSORS}: {name} is {tensor.dtype}; the converter reads F32, F16 and "
                "BF16 LoRA weights."
            )
        suffix = next((s for s in LORA_SUFFIXES if name.endswith(s)), None)
        if suffix is None or not name.startswith(PEFT_PREFIX):
            raise InvalidAdapter(f"{SAFETENSORS}: {name} {_not_lora(name)}")
        module = name[len(PEFT_PREFIX) : -len(suffix)]
        target = names.get_name(module)
        # Only projections inside the blocks: a LoRA on the (tied) embeddings or the output
        # head is applied differently by llama.cpp, if at all.
        layer = _LAYER.search(module)
        if layer and int(layer.group(1)) >= layout.block_count:
            raise InvalidAdapter(
                f"{SAFETENSORS}: {name} adapts {module!r}, but the base model has "
                f"{layout.block_count} blocks (0 to {layout.block_count - 1}): is it the right "
                "base model?"
            )
        if target is None or not target.startswith("blk."):
            raise InvalidAdapter(
                f"{SAFETENSORS}: {name} adapts {module!r}, which is not a projection of a "
                f"{layout.architecture} block that llama.cpp can adapt."
            )
        target += ".weight"
        if target not in layout.shapes:
            raise InvalidAdapter(
                f"{SAFETENSORS}: {name} adapts {module!r} ({target}), which the base model "
                "does not have: is it the right base model?"
            )
        if len(tensor.shape) != 2:
            raise InvalidAdapter(
                f"{SAFETENSORS}: {name} has {len(tensor.shape)} dimensions, not 2."
            )
        halves.setdefault(target, {})[LORA_SUFFIXES[suffix]] = tensor
    pairs = {}
    for target, half in halves.items():
        if set(half) != {"a", "b"}:
            have = next(iter(half.values())).name
            raise InvalidAdapter(f"{SAFETENSORS}: {have} has no lora_A/lora_B partner.")
        pairs[target] = (half["a"], half["b"])
    return pairs


def _not_lora(name: str) -> str:
    if "lora_magnitude_vector" in name:
        return "is a DoRA magnitude vector, which llama.cpp does not apply."
    if "lora_embedding_" in name or "embed_tokens" in name or "lm_head" in name:
        return (
            "changes the embeddings or the output head, which llama.cpp's LoRA does not "
            "(train without modules_to_save and without embedding targets)."
        )
    if name.endswith(".bias"):
        return "is a bias; llama.cpp's LoRA changes weights only (train with bias='none')."
    return f"is not a PEFT LoRA tensor ({PEFT_PREFIX}<module>.lora_A.weight / .lora_B.weight)."


def _arch(name: str) -> gguf.MODEL_ARCH:
    return next(arch for arch, known in _gguf().MODEL_ARCH_NAMES.items() if known == name)


def _gguf() -> ModuleType:
    # An optional dependency (the embedded extra): only llama.cpp endpoints need it.
    try:
        import gguf
    except ImportError as exc:
        raise CoevoError(
            "The gguf package is not installed, so the adapter cannot be written for llama.cpp: "
            "pip install 'coevo[embedded]' on the training worker."
        ) from exc
    return gguf


def _tensor_read(f: Any, tensor: SafetensorsTensor) -> np.ndarray:
    f.seek(tensor.start)
    raw = np.frombuffer(f.read(tensor.end - tensor.start), dtype=DTYPES[tensor.dtype])
    if tensor.dtype == "BF16":
        # bfloat16 is the top half of a float32.
        values = (raw.astype(np.uint32) << 16).view(np.float32)
    else:
        values = raw.astype(np.float32)
    if not np.isfinite(values).all():
        raise InvalidAdapter(
            f"{SAFETENSORS}: {tensor.name} holds NaN or infinite values: the training diverged "
            "(lower the learning rate)."
        )
    return values.reshape(tensor.shape)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


# --- loading it in llama.cpp -----------------------------------------------------------------

# Run in a child process: a file llama.cpp cannot read may crash it, and a slow load is
# ended at the timeout instead of holding the training worker.
_GREEDY_SCRIPT = """
import json, sys
from llama_cpp import Llama
model, adapter, prompt, tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
llm = Llama(model_path=model, lora_path=adapter or None, n_ctx=256, seed=0, verbose=True)
out = llm.create_completion(prompt, max_tokens=tokens, temperature=0.0)
print(json.dumps({"text": out["choices"][0]["text"]}))
"""
_REASON = re.compile(r"error|fail|incorrect|does not exist|mismatch|missing|expect", re.I)
_LOG_TAIL_BYTES = 64 * 1024


def gguf_greedy_text(
    *,
    model: Path,
    adapter: Path | None = None,
    prompt: str = LOAD_CHECK_PROMPT,
    max_tokens: int = LOAD_CHECK_TOKENS,
    timeout_s: float = LOAD_CHECK_TIMEOUT_S,
) -> str:
    """Greedy completion of ``prompt`` by llama.cpp from the GGUF ``model`` with the GGUF LoRA
    ``adapter`` applied (none: the base model), in a child process ended at ``timeout_s``."""
    _llama_cpp_require()
    argv = [sys.executable, "-c", _GREEDY_SCRIPT, str(model), str(adapter or ""), prompt,
            str(max_tokens)]  # fmt: skip
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            done = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                timeout=timeout_s,
                # The adapter is a trainer's output, parsed by llama.cpp's C++ loader: its
                # process gets a trainer's scrubbed environment, not the worker's credentials.
                env=trainer_environment(extra={}, inputs={}),
            )
        except subprocess.TimeoutExpired as exc:
            raise CoevoError(
                f"llama.cpp did not load {model.name}"
                + (f" with {adapter.name}" if adapter else "")
                + f" and answer within {timeout_s:g} s."
            ) from exc
        lines = _tail(out).splitlines()
        if done.returncode != 0 or not lines:
            log = _tail(err).splitlines()
            reasons = [line.strip() for line in log if _REASON.search(line)][-3:]
            raise CoevoError(
                f"llama.cpp exited with status {done.returncode} loading {model.name}"
                + (f" with {adapter.name}" if adapter else "")
                + ": "
                + (" | ".join(reasons or log[-3:]) or "no output")
            )
    try:
        return str(json.loads(lines[-1])["text"])
    except (ValueError, KeyError, TypeError) as exc:
        raise CoevoError(f"llama.cpp's check printed no result: {lines[-1][:200]!r}") from exc


def _llama_cpp_require() -> None:
    if importlib.util.find_spec("llama_cpp") is None:
        raise CoevoError(
            "llama-cpp-python is not installed, so the adapter cannot be checked in llama.cpp: "
            "pip install 'coevo[embedded]' on the training worker."
        )


def _tail(f: Any) -> str:
    size = f.seek(0, os.SEEK_END)
    f.seek(max(0, size - _LOG_TAIL_BYTES))
    return f.read().decode("utf-8", "replace")


def adapter_gguf_load_check(
    *, base_gguf: Path, adapter_gguf: Path, timeout_s: float = LOAD_CHECK_TIMEOUT_S
) -> str:
    """llama.cpp loads ``adapter_gguf`` on ``base_gguf`` and generates a few greedy tokens
    with it (returned); raises InvalidAdapter with llama.cpp's reason when it cannot."""
    _llama_cpp_require()
    try:
        return gguf_greedy_text(model=base_gguf, adapter=adapter_gguf, timeout_s=timeout_s)
    except CoevoError as exc:
        raise InvalidAdapter(f"llama.cpp refused the converted adapter: {exc}") from exc


__all__ = [
    "GGUF_ADAPTER",
    "BaseLayout",
    "GgufAdapterInfo",
    "adapter_gguf_load_check",
    "adapter_gguf_write",
    "base_gguf_layout",
    "gguf_greedy_text",
]
