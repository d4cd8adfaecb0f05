"""The libraries the CPU trainer needs (the ``train`` extra) and how to say they are missing.

Checked with ``importlib.util.find_spec``, which finds a module without importing it: the
registration asks on the web or CLI side, where importing torch would cost seconds and memory.
"""

from __future__ import annotations

import importlib.util

# Module names (not distributions): what the program imports.
REQUIRED = ("torch", "transformers", "peft", "gguf", "safetensors")
INSTALL_HINT = (
    "pip install 'coevo[train]' (install a CPU build of torch first, or pip pulls a CUDA build "
    "of several GB: pip install torch --index-url https://download.pytorch.org/whl/cpu; where "
    "a local CPU wheel is offered, as on coevo's development machines, pip install "
    "torch==2.13.0)"
)
EXIT_BAD_INPUT = 2
EXIT_MISSING_LIBRARY = 3


def libraries_missing() -> list[str]:
    """The required modules this Python cannot find."""
    missing = []
    for name in REQUIRED:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a parent package that fails, a None in sys.modules
            found = False
        if not found:
            missing.append(name)
    return missing


def libraries_message(missing: list[str], python: str) -> str:
    return (
        f"The CPU trainer needs {', '.join(missing)}, which {python} cannot import. "
        f"Install the training extra into that environment: {INSTALL_HINT}."
    )
