"""A trainer command that really runs, for the alternating-campaign tests on CPU.

    python tests/support/tiny_trainer.py --data {export} --base {base_model} --out {output_dir}

It reads the exported JSONL as a trainer would (every row must carry ``messages`` or
``prompt``/``completion`` and provenance), prints a loss per "epoch", and writes what PEFT's
``save_pretrained`` writes: ``adapter_config.json`` and ``adapter_model.safetensors`` (a real
safetensors file: little-endian header length, JSON header, float32 data). Its weights are a
deterministic function of the data, so the same export gives the same adapter bytes.

``--sleep S`` sleeps between epochs (time-limit tests); ``--fail`` exits 3 after printing;
``--no-weights`` leaves the weights out (adapter-validation tests); ``--print-env`` prints the
environment's variable names (the environment-scrubbing test).

``--lora-shapes q_proj=1024x640,v_proj=256x640 --layers 18 --rank 8`` writes an adapter shaped
for a real model instead (the tests read the shapes from the shipped Gemma 3 270M GGUF): PEFT's
names (``base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight``), A ``(r, in)`` and
B ``(out, r)``, small random values seeded by the data (the llama.cpp adapter tests).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


def write_safetensors(
    path: Path, tensors: dict[str, tuple[list[int], Any]], *, dtype: str = "F32"
) -> None:
    """``tensors``: name -> (shape, values: a list or an array), written as ``dtype`` (F32,
    F16, F64 or BF16, bfloat16 by truncating float32)."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    data = b""
    for name, (shape, values) in tensors.items():
        array = np.asarray(values, dtype=np.float32).reshape(shape)
        if dtype == "BF16":
            raw = (array.view(np.uint32) >> 16).astype("<u2").tobytes()
        else:
            raw = array.astype({"F32": "<f4", "F16": "<f2", "F64": "<f8"}[dtype]).tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": shape,
            "data_offsets": [len(data), len(data) + len(raw)],
        }
        data += raw
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)  # safetensors pads the header to 8 bytes
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)


# Where a Hugging Face decoder keeps each projection.
BLOCK_PART = {
    "q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
    "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp",
}  # fmt: skip


def lora_tensors(
    shapes: dict[str, tuple[int, int]],
    *,
    layers: int,
    rank: int,
    seed: bytes,
    a_scale: float = 0.1,
    b_scale: float = 0.01,
) -> dict[str, tuple[list[int], np.ndarray]]:
    """PEFT's LoRA tensors for ``shapes`` (module -> (out, in)) in every one of ``layers``
    blocks, random (seeded by ``seed``) with the given scales; ``b_scale=0`` gives the zero B
    a fresh PEFT adapter starts from."""
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(seed).digest()[:8], "little"))
    tensors = {}
    for layer in range(layers):
        for module, (out_features, in_features) in shapes.items():
            prefix = f"base_model.model.model.layers.{layer}.{BLOCK_PART[module]}.{module}"
            a = rng.standard_normal((rank, in_features), dtype=np.float32) * a_scale
            b = rng.standard_normal((out_features, rank), dtype=np.float32) * b_scale
            tensors[f"{prefix}.lora_A.weight"] = ([rank, in_features], a)
            tensors[f"{prefix}.lora_B.weight"] = ([out_features, rank], b)
    return tensors


def write_shaped_adapter(
    out: Path,
    *,
    base: str,
    shapes: dict[str, tuple[int, int]],
    layers: int,
    rank: int = 8,
    seed: bytes = b"",
    dtype: str = "F32",
    config: dict[str, Any] | None = None,
    **scales: float,
) -> None:
    """An adapter shaped for a real model (see lora_tensors); ``config`` adds to or overrides
    its adapter_config.json."""
    out.mkdir(parents=True, exist_ok=True)
    settings = {
        "peft_type": "LORA",
        "base_model_name_or_path": base,
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": sorted(shapes),
        "task_type": "CAUSAL_LM",
        "bias": "none",
        "use_dora": False,
        "use_rslora": False,
        "modules_to_save": None,
    }
    (out / "adapter_config.json").write_text(json.dumps({**settings, **(config or {})}, indent=2))
    tensors = lora_tensors(shapes, layers=layers, rank=rank, seed=seed, **scales)
    write_safetensors(out / "adapter_model.safetensors", tensors, dtype=dtype)


def parse_shapes(spec: str) -> dict[str, tuple[int, int]]:
    """ "q_proj=1024x640,v_proj=256x640" -> {"q_proj": (1024, 640), "v_proj": (256, 640)}."""
    shapes = {}
    for item in spec.split(","):
        module, dims = item.split("=")
        out_features, in_features = dims.split("x")
        shapes[module] = (int(out_features), int(in_features))
    return shapes


def write_adapter(out: Path, *, base: str, seed: bytes, rank: int = 4) -> None:
    out.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA",
        "base_model_name_or_path": base,
        "r": rank,
        "lora_alpha": 2 * rank,
        "target_modules": ["q_proj", "v_proj"],
        "task_type": "CAUSAL_LM",
    }
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2))
    values = [b / 255.0 for b in hashlib.sha256(seed).digest()[: rank * 4]]
    write_safetensors(
        out / "adapter_model.safetensors",
        {
            "base_model.model.layers.0.self_attn.q_proj.lora_A.weight": ([rank, 4], values),
            "base_model.model.layers.0.self_attn.q_proj.lora_B.weight": ([4, rank], values),
        },
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--base", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--fail", action="store_true")
    parser.add_argument("--no-weights", action="store_true")
    parser.add_argument("--print-env", action="store_true")
    parser.add_argument("--lora-shapes", help="module=OUTxIN,...: a real model's projections")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--rank", type=int, default=8)
    args = parser.parse_args()

    if args.print_env:
        print("env:", " ".join(sorted(os.environ)))
    rows = [json.loads(line) for line in Path(args.data).read_text().splitlines() if line]
    for i, row in enumerate(rows):
        if "messages" not in row and "prompt" not in row:
            print(f"row {i}: neither messages nor prompt", file=sys.stderr)
            return 2
        if not row.get("provenance", {}).get("harness_sha"):
            print(f"row {i}: no provenance.harness_sha", file=sys.stderr)
            return 2
    print(f"loaded {len(rows)} rows from {args.data} for base {args.base}", flush=True)
    for epoch in range(1, args.epochs + 1):
        print(f"epoch {epoch}/{args.epochs} loss {1.0 / (epoch + len(rows)):.4f}", flush=True)
        if args.sleep:
            time.sleep(args.sleep)
    if args.fail:
        print("diverged: loss is nan", file=sys.stderr)
        return 3
    out = Path(args.out)
    if args.lora_shapes:
        write_shaped_adapter(
            out,
            base=args.base,
            shapes=parse_shapes(args.lora_shapes),
            layers=args.layers,
            rank=args.rank,
            seed=Path(args.data).read_bytes(),
        )
    else:
        write_adapter(out, base=args.base, seed=Path(args.data).read_bytes())
    if args.no_weights:
        (out / "adapter_model.safetensors").unlink()
    print(f"saved adapter to {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
