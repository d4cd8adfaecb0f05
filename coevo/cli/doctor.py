"""``coevo doctor``: check this installation and say how to fix what is broken."""

from __future__ import annotations

import argparse
import os
from typing import Any


def register(commands: Any) -> None:
    doctor = commands.add_parser(
        "doctor",
        help="check this installation (packages, sandbox, database, broker, store, policies)",
        description="Check the installation and print each problem with its fix; exits 1 "
        "when something is broken (warnings do not fail) or when there is no installation "
        "here yet (COEVO_HOME, or the embedded SQLite database, does not exist: the doctor "
        "then creates nothing).",
    )
    doctor.add_argument("--json", action="store_true", help="print the results as JSON")
    doctor.set_defaults(handler=run)


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from coevo.ops.doctor import (
        FAIL,
        CheckResult,
        doctor_format,
        doctor_run,
        installation_missing,
    )

    # Before django.setup(): loading settings would create the home and database it checks.
    missing = installation_missing()
    if missing is not None:
        print(doctor_format([missing], as_json=True) if args.json else missing.detail + ".")
        return 1
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coevo.settings")
    try:
        import django

        django.setup()
    except Exception as exc:
        # Settings validate the environment as they load: a bad variable lands here.
        results = [
            CheckResult(
                "configuration",
                FAIL,
                f"{type(exc).__name__}: {exc}",
                "Fix the variable named above (docs/configuration.md lists them all).",
            )
        ]
    else:
        results = [CheckResult("configuration", "ok", "settings load")] + doctor_run()
    print(doctor_format(results, as_json=args.json))
    return 1 if any(result.failed for result in results) else 0
