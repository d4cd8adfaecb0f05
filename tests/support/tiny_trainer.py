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


def write_safetensors(path: Path, tensors: dict[str, tuple[list[int], list[float]]]) -> None:
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    data = b""
    for name, (shape, values) in tensors.items():
        raw = struct.pack(f"<{len(values)}f", *values)
        header[name] = {
            "dtype": "F32",
            "shape": shape,
            "data_offsets": [len(data), len(data) + len(raw)],
        }
        data += raw
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)  # safetensors pads the header to 8 bytes
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)


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
    write_adapter(out, base=args.base, seed=Path(args.data).read_bytes())
    if args.no_weights:
        (out / "adapter_model.safetensors").unlink()
    print(f"saved adapter to {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
