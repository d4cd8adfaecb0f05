"""Suite kinds on the platform's side: how each kind's suites are imported and listed, one
registered class per kind (``base.PlatformKind``, ``register_suite_kind``).

``manage.py suite_import``, the dashboard's import page and the task listings read them from
here. A kind's value and label are its ``SuiteKind`` member; its worker side is its
environment (workers/environments/). The contract is described in ``base.py``.
"""

from __future__ import annotations

import importlib
import pkgutil

from coevo.suites.kinds.base import (
    CommandImport,
    Imported,
    ImportReport,
    PlatformKind,
    Progress,
    ShippedImport,
    UploadImport,
    command_imports,
    platform_kind,
    register_suite_kind,
    registered_suite_kinds,
    shipped_imports,
    upload_imports,
)

__all__ = [
    "CommandImport",
    "ImportReport",
    "Imported",
    "PlatformKind",
    "Progress",
    "ShippedImport",
    "UploadImport",
    "command_imports",
    "platform_kind",
    "register_suite_kind",
    "registered_suite_kinds",
    "shipped_imports",
    "upload_imports",
]

# Every module of this package is imported, and each registers its kind when it is: a new suite
# kind's platform side is one module here (and its SuiteKind member), named nowhere else.
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
