"""A minimal valid GGUF LoRA adapter for a base GGUF model, written with the ``gguf`` package,
for tests that need llama.cpp to load an adapter (the real converter is coevo's own; this one
only has to be what llama.cpp accepts).

The layout follows llama.cpp's convert_lora_to_gguf.py and its loader (llama-adapter.cpp):
``general.type`` = adapter, ``adapter.type`` = lora, ``adapter.lora.alpha``, the base's
``general.architecture``; for a base tensor ``W`` of GGUF shape [n_in, n_out], a tensor
``<W>.lora_a`` of shape [n_in, rank] and ``<W>.lora_b`` of shape [rank, n_out] (numpy writes
them reversed: (rank, n_in) and (n_out, rank)), so that the update is ``B @ A`` scaled by
alpha / rank.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFWriter

TARGETS = re.compile(r"blk\.\d+\.attn_(q|v)\.weight")


def write_lora_gguf(
    path: Path, *, base: Path, rank: int = 8, alpha: float = 16.0, scale: float = 0.1, seed: int = 0
) -> Path:
    """Random LoRA weights on every layer's attention q and v projections of ``base``; large
    enough (``scale``) that greedy completions change, so a test sees the adapter applied."""
    reader = GGUFReader(base)
    architecture = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(str(path), architecture)
    writer.add_type("adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", alpha)
    rng = np.random.default_rng(seed)
    for tensor in reader.tensors:
        if not TARGETS.fullmatch(tensor.name):
            continue
        n_in, n_out = (int(n) for n in tensor.shape)
        a = rng.normal(0.0, scale, (rank, n_in)).astype(np.float32)
        b = rng.normal(0.0, scale, (n_out, rank)).astype(np.float32)
        writer.add_tensor(f"{tensor.name}.lora_a", a)
        writer.add_tensor(f"{tensor.name}.lora_b", b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
