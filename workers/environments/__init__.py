"""Environments: what a harness sees of a task, and the trusted verifier, one registered class
per suite kind (``base.Environment``, ``register_environment``).

Both run on the worker side; only ``harness_view`` output ever enters the sandbox. The
contract (single-answer and multi-step environments, helpers) is described in ``base.py``.
"""

from __future__ import annotations

import importlib
import pkgutil

from coevo.errors import InvalidInput
from workers.environments.base import (
    Environment,
    register_environment,
    registered_environment,
    registered_kinds,
)

__all__ = ["Environment", "environment_for", "register_environment", "registered_kinds"]

# Every module of this package is imported, and each registers its kind's environment when it
# is: a new suite kind's environment is one module here, named nowhere else.
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")


def environment_for(kind: str) -> Environment:
    environment = registered_environment(kind)
    if environment is None:
        raise InvalidInput(f"No environment for suites of kind {kind!r}.")
    return environment
