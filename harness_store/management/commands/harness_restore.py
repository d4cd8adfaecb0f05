"""``manage.py harness_restore --from DIR [--force]``: recreate the repositories of a backup."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from coevo.errors import CoevoError
from harness_store.maintenance import store_restore


class Command(BaseCommand):
    help = (
        "Restore the harness store from a harness_backup directory: checks every bundle "
        "against the manifest, fetches all its refs into a fresh repository and runs git fsck. "
        "Refuses to replace a repository that has commits unless --force."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--from", dest="source", required=True, help="backup directory")
        parser.add_argument(
            "--force", action="store_true", help="replace repositories that already have commits"
        )
        parser.add_argument(
            "--project-id",
            action="append",
            default=None,
            help="restore only this project (its id; repeatable)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            results = store_restore(
                source=Path(options["source"]),
                force=options["force"],
                project_ids=options["project_id"],
            )
        except CoevoError as exc:
            raise CommandError(str(exc)) from exc
        for result in results:
            verb = "replaced" if result.replaced else "restored"
            self.stdout.write(f"{result.project_slug}: {verb}, {result.refs} refs ({result.path})")
        self.stdout.write(f"Restored {len(results)} repositories.")
