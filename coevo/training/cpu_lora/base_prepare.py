"""The command that makes the base model's dequantized copy (``base_cache``) when missing.

    python -m coevo.training.cpu_lora.base_prepare [--base-model NAME] [--gguf-dir DIR]

(``--gguf-dir``: COEVO_GGUF_DIR by default, as coevo's settings read it)
makes it when missing (about 2 minutes on 2 cores for Gemma 3 270M; needs the ``train`` extra)
and prints its directory as the last line of stdout, progress on stderr. Exit status: 0, 2 when
there is no GGUF file for the model, 3 when a library of the ``train`` extra is missing, 1 when
the copy could not be written. torch (``model``) is imported only when the copy is missing.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from coevo.training.cpu_lora.base_cache import GENERATION_CONFIG, base_cache_ready, turn_end_write


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m coevo.training.cpu_lora.base_prepare")
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
