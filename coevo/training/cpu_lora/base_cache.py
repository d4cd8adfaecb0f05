"""The base model's dequantized copy, kept beside its GGUF file (``base_prepare`` makes it).

``model.base_load`` reads a GGUF file once and keeps its float32 weights, config and tokenizer
as transformers saves them in ``<gguf dir>/.cpu-lora-cache/<file>-<size>-<mtime>/``: a Hugging
Face model directory, which the trainer loads in a second and a local vLLM serves
(coevo/policies/vllm_local.py). Its tokenizer adds Gemma's BOS as the GGUF file says; the GGUF
file carries no chat template, which the local vLLM is given on its own; the command adds
the tokens that end a turn (``turn_end_write``). This module imports nothing heavy: the check
for the copy is quick, and torch is imported only to make it (``base_prepare``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

CACHE_DIR = ".cpu-lora-cache"
WEIGHTS = "model.safetensors"


def base_cache_dir(path: Path) -> Path:
    """The cache of the GGUF file at ``path``: its name, size and modification time in the
    name, so a replaced file is never read through a stale cache."""
    stat = path.stat()
    return path.parent / CACHE_DIR / f"{path.stem}-{stat.st_size}-{stat.st_mtime_ns}"


def base_cache_ready(path: Path) -> Path | None:
    """The cache of the GGUF file at ``path`` when it is complete (it is renamed into place
    whole), else None."""
    cached = base_cache_dir(path)
    return cached if (cached / WEIGHTS).is_file() else None


# Special tokens that end a chat turn where the model's EOS does not: Gemma's <end_of_turn>,
# ChatML's <|im_end|>, Llama 3's <|eot_id|>.
TURN_ENDS = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>")
GENERATION_CONFIG = "generation_config.json"


def turn_end_write(cached: Path) -> list[int]:
    """Write ``generation_config.json`` into the cache naming the tokens that end generation:
    the model's EOS and its end-of-turn token (Gemma's ``<end_of_turn>``), as llama.cpp reads
    them from the GGUF file. transformers' GGUF reader keeps only the EOS, so a server reading
    the directory (vLLM) would otherwise let a chat reply run past the model's turn to its
    max_tokens. Only stop tokens: the GGUF file says nothing of sampling. Returns them."""
    config = json.loads((cached / "config.json").read_text())
    tokenizer = json.loads((cached / "tokenizer.json").read_text())
    eos = config.get("eos_token_id")
    stops = [eos] if isinstance(eos, int) else [i for i in eos or [] if isinstance(i, int)]
    for token in tokenizer.get("added_tokens") or []:
        if token.get("content") in TURN_ENDS and token.get("id") not in stops:
            stops.append(token["id"])
    generation = {"bos_token_id": config.get("bos_token_id"), "eos_token_id": stops}
    partial = cached / f".{GENERATION_CONFIG}.{os.getpid()}"
    partial.write_text(json.dumps(generation, indent=2) + "\n")
    os.replace(partial, cached / GENERATION_CONFIG)
    return stops
