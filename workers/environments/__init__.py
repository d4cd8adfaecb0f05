"""Environment adapters: what a harness sees of a task, and the trusted verifier.

Both run on the worker side; only ``harness_view`` output ever enters the sandbox.
"""

from __future__ import annotations

from types import ModuleType

from coevo.errors import InvalidInput
from workers.environments import humaneval

_ADAPTERS: dict[str, ModuleType] = {"humaneval": humaneval}


def adapter_for(kind: str) -> ModuleType:
    try:
        return _ADAPTERS[kind]
    except KeyError:
        raise InvalidInput(f"No environment adapter for suites of kind {kind!r}.") from None
