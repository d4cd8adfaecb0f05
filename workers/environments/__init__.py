"""Environment adapters: what a harness sees of a task, and the trusted verifier.

Both run on the worker side; only ``harness_view`` output ever enters the sandbox. The
contract (single-answer and multi-step adapters, helpers) is described in ``base.py``.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from coevo.errors import InvalidInput
from workers.environments import humaneval, jsonl, textworld, workspace

_ADAPTERS: dict[str, ModuleType] = {
    "humaneval": humaneval,
    "jsonl": jsonl,
    "textworld": textworld,
    "workspace": workspace,
}


def adapter_for(kind: str) -> ModuleType:
    try:
        return _ADAPTERS[kind]
    except KeyError:
        raise InvalidInput(f"No environment adapter for suites of kind {kind!r}.") from None


def adapter_is_multi_step(adapter: ModuleType) -> bool:
    return bool(getattr(adapter, "MULTI_STEP", False))


def adapter_has_workspace(adapter: ModuleType) -> bool:
    return bool(getattr(adapter, "WORKSPACE", False))


def adapter_helpers(adapter: ModuleType) -> dict[str, Callable[..., dict[str, Any]]]:
    return dict(getattr(adapter, "HELPERS", {}))
