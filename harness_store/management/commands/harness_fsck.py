"""``manage.py harness_fsck``: check every project's repository now and record the results."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from harness_store.maintenance import store_fsck_all


class Command(BaseCommand):
    help = (
        "Run git fsck on every project's repository and check that every candidate in the "
        "database is present in git; records each result (shown on the system page). Exits "
        "non-zero when a repository fails."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        checks = store_fsck_all()
        failed = [check for check in checks if not check.ok]
        for check in checks:
            status = "ok" if check.ok else "FAILED"
            self.stdout.write(f"{check.project.slug}: {status} ({check.duration_ms} ms)")
            if not check.ok:
                self.stdout.write("  " + check.output.replace("\n", "\n  "))
        if failed:
            raise CommandError(
                f"{len(failed)} of {len(checks)} repositories failed the check: restore them "
                "from a backup (docs/operations.md, 'Restore')."
            )
        self.stdout.write(f"{len(checks)} repositories ok.")
