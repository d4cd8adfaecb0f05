"""``python -m coevo.training.cpu_lora``: the built-in CPU trainer (coevo.training.cpu_lora.program)."""

import sys

from coevo.training.cpu_lora.program import main

# Guarded: importing the package's modules (tests that walk every module, tooling) must not run it.
if __name__ == "__main__":
    sys.exit(main())
