"""The base model's dequantized copy, kept beside its GGUF file, and a command that makes it.

``model.base_load`` reads a GGUF file once and keeps its float32 weights, config and tokenizer
as transformers saves them in ``<gguf dir>/.cpu-lora-cache/<file>-<size>-<mtime>/``: a Hugging
Face model directory, which the trainer loads in a second and a local vLLM serves
(coevo/policies/vllm_local.py). Its tokenizer adds Gemma's BOS as the GGUF file says; the GGUF
file carries no chat template, which the local vLLM is given on its own; the command below adds
the tokens that end a turn (``turn_end_write``).

    python -m coevo.training.cpu_lora.base_cache [--base-model NAME] [--gguf-dir DIR]

(``--gguf-dir``: COEVO_GGUF_DIR by default, as coevo's settings read it)
makes it when missing (about 2 minutes on 2 cores for Gemma 3 270M; needs the ``train`` extra)
and prints its directory as the last line of stdout, progress on stderr. Exit status: 0, 2 when
there is no GGUF file for the model, 3 when a library of the ``train`` extra is missing, 1 when
the copy could not be written. This module imports nothing heavy: the check for the copy is
quick, and torch is imported only to make it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coevo.training.cpu_lora.base_cache")
    parser.add_argument("--base-model", default="gemma-3-270m")
    parser.add_argument(
        "--gguf-dir",
        type=Path,
        help="where base models' GGUF files are (default: COEVO_GGUF_DIR, as coevo's settings "
        "read it: COEVO_HOME/models unless set)",
    )
    args = parser.parse_args(argv)

    from coevo.config import env_path, home_dir
    from coevo.errors import CoevoError
    from coevo.policies.embedded import base_model_gguf
    from coevo.training.cpu_lora.libraries import (
        EXIT_BAD_INPUT,
        EXIT_MISSING_LIBRARY,
        libraries_message,
        libraries_missing,
    )

    if args.gguf_dir is None:
        set_dir = os.environ.get("COEVO_GGUF_DIR")
        args.gguf_dir = env_path("COEVO_GGUF_DIR", "") if set_dir else home_dir() / "models"
    try:
        path = base_model_gguf(args.base_model, models_dir=args.gguf_dir)
    except CoevoError as exc:
        print(exc, file=sys.stderr)
        return EXIT_BAD_INPUT
    ready = base_cache_ready(path)
    if ready is None:
        missing = libraries_missing()
        if missing:
            print(libraries_message(missing, sys.executable), file=sys.stderr)
            return EXIT_MISSING_LIBRARY
        print(f"dequantizing {path} (once; about 2 minutes on 2 cores)", file=sys.stderr)
        started = time.monotonic()
        # The GGUF loader's progress bars would fill a log with carriage returns.
        os.environ["TQDM_DISABLE"] = "1"
        from coevo.training.cpu_lora import model

        _, _, source = model.base_load(path, cache=True)
        ready = base_cache_ready(path)
        if ready is None:
            print(f"the copy was not written: {source}", file=sys.stderr)
            return 1
        print(f"written in {time.monotonic() - started:.0f} s", file=sys.stderr)
    if not (ready / GENERATION_CONFIG).is_file():
        turn_end_write(ready)
    print(ready)
    return 0


# Guarded: importing the package's modules (tests that walk every module, tooling) must not run it.
if __name__ == "__main__":
    sys.exit(main())
