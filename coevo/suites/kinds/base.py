"""The contract between the platform and a suite kind: how its suites are imported (the command
line's ``suite_import`` subcommands, the dashboard's buttons and upload forms) and listed.

A kind is a subclass of ``PlatformKind`` registered with ``@register_suite_kind`` in its own
module (coevo/suites/kinds/<kind>.py); the package imports every one of its modules, and the
command, the import page and the selectors read the registry, never a kind's name. A kind's
stored value and label are its ``SuiteKind`` member (the model's enumeration, which migrations
record and both sides name); its worker side is its environment (workers/environments/).

Imports are declared in three shapes, each with a ``run`` that returns ``Imported``:

- ``CommandImport``: a ``suite_import`` subcommand; ``run(*, project, options, progress)``
  gets the parsed options, and ``progress(done, total, task key)`` for imports that check
  tasks one by one;
- ``ShippedImport``: a dashboard button importing a suite shipped with coevo, with its
  defaults; ``run(*, project, actor)``;
- ``UploadImport``: a dashboard form importing an upload; ``run(*, project, data, actor)``
  gets the form's ``cleaned_data`` (the page validates the form first).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from django import forms

from coevo.errors import InvalidInput

if TYPE_CHECKING:
    from coevo.suites.models import Suite

Progress = Callable[[int, int, str], Any]


class ImportReport(Protocol):
    """What an import that takes some tasks and refuses others says about them."""

    taken: list[str]
    refused: list[tuple[str, str]]  # (task key, why)
    warnings: list[tuple[str, str]]  # (task key, what)


@dataclass(frozen=True)
class Imported:
    suite: Suite
    created: bool
    report: ImportReport | None = None


@dataclass(frozen=True)
class CommandImport:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[..., Imported]


@dataclass(frozen=True)
class ShippedImport:
    name: str  # the button's ``kind`` field
    button: str
    run: Callable[..., Imported]


@dataclass(frozen=True)
class UploadImport:
    name: str  # the form's ``kind`` field
    title: str
    form: type[forms.Form]
    # HTML before the form; ``{max_megabytes}`` is the page's limit on an upload, in MiB.
    description: str
    run: Callable[..., Imported]
    notes: str = ""  # HTML after the form's fields


class PlatformKind:
    """A suite kind as the platform sees it (see the module doc). One instance a kind."""

    kind: ClassVar[str] = ""
    commands: ClassVar[tuple[CommandImport, ...]] = ()
    shipped: ClassVar[tuple[ShippedImport, ...]] = ()
    uploads: ClassVar[tuple[UploadImport, ...]] = ()
    # The key of a task's inputs that a task listing shows instead of all of them, read out by
    # the database: for kinds whose inputs may be large (a workspace's starting files).
    listed_input: ClassVar[str | None] = None
    # Whether a task may run in an image of its own, built from its ``inputs.environment``:
    # the suite's page then shows each such task's latest build.
    task_images: ClassVar[bool] = False


def split_seed_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--split-seed", default="0", help="seed of the hash split (default 0)")


_REGISTRY: dict[str, PlatformKind] = {}
K = TypeVar("K", bound=type[PlatformKind])


def register_suite_kind(cls: K) -> K:
    """Class decorator: ``cls`` is how the platform imports and lists suites of ``cls.kind``.
    Its imports' names may not be another kind's: they are subcommands and form values."""
    kind = str(cls.kind)
    if not kind:
        raise TypeError(f"{cls.__name__} names no suite kind")
    if kind in _REGISTRY and type(_REGISTRY[kind]) is not cls:
        raise TypeError(f"suite kind {kind!r} already has {type(_REGISTRY[kind]).__name__}")
    others = [k for name, k in _REGISTRY.items() if name != kind]
    taken_commands = {c.name for k in others for c in k.commands}
    taken_pages = {i.name for k in others for i in (*k.shipped, *k.uploads)}
    ours_pages = [i.name for i in (*cls.shipped, *cls.uploads)]
    clashes = sorted(
        ({c.name for c in cls.commands} & taken_commands) | (set(ours_pages) & taken_pages)
    )
    if clashes or len(set(ours_pages)) != len(ours_pages):
        raise TypeError(f"{cls.__name__}: import name(s) {clashes or ours_pages} already taken")
    _REGISTRY[kind] = cls()
    return cls


def registered_suite_kinds() -> list[str]:
    return sorted(_REGISTRY)


def platform_kind(kind: str) -> PlatformKind:
    found = _REGISTRY.get(kind)
    if found is None:
        raise InvalidInput(f"No platform registration for suites of kind {kind!r}.")
    return found


# In the order of their kinds, then as each kind declares them: the order users see them in.
def command_imports() -> dict[str, CommandImport]:
    return {c.name: c for kind in registered_suite_kinds() for c in _REGISTRY[kind].commands}


def shipped_imports() -> dict[str, ShippedImport]:
    return {s.name: s for kind in registered_suite_kinds() for s in _REGISTRY[kind].shipped}


def upload_imports() -> dict[str, UploadImport]:
    return {u.name: u for kind in registered_suite_kinds() for u in _REGISTRY[kind].uploads}
