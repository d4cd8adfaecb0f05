"""``python manage.py suite_import --project SLUG KIND …``: one subcommand per import a suite kind
registers (coevo/suites/kinds/); the dashboard's import page offers the same kinds."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from coevo.errors import CoevoError
from coevo.projects.models import Project
from coevo.suites.jsonl import SuiteImportError
from coevo.suites.kinds import ImportReport, command_imports
from coevo.suites.selectors import suite_split_counts

MAX_ERRORS_SHOWN = 50


class Command(BaseCommand):
    help = "Import a task suite into a project (identical content returns the existing suite)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--project", required=True, help="the project's slug")
        kinds = parser.add_subparsers(dest="kind", required=True, metavar="KIND")
        for name, importer in command_imports().items():
            importer.add_arguments(kinds.add_parser(name, help=importer.help))

    def handle(self, *args: Any, **options: Any) -> None:
        project = Project.objects.filter(slug=options["project"]).first()
        if project is None:
            raise CommandError(
                f"No project {options['project']!r}; create it first or check the slug."
            )
        try:
            imported = command_imports()[options["kind"]].run(
                project=project, options=options, progress=self._progress
            )
        except SuiteImportError as exc:
            shown = exc.errors[:MAX_ERRORS_SHOWN]
            for line in shown:
                self.stderr.write(line)
            if exc.total > len(shown):
                self.stderr.write(f"… and {exc.total - len(shown)} more errors")
            raise CommandError(
                f"The suite was not imported: {exc.total} error(s), the first: {exc.errors[0]}. "
                "Fix them and run again."
            ) from exc
        except CoevoError as exc:
            raise CommandError(str(exc)) from exc
        suite, created = imported.suite, imported.created
        if imported.report is not None:
            self._report(imported.report)
        counts = suite_split_counts(suite=suite)
        status = "imported as a new suite" if created else "already imported (same content)"
        self.stdout.write(f"{suite.name} {suite.version} ({suite.get_kind_display()}): {status}")
        self.stdout.write(f"  content hash {suite.content_hash}, split seed {suite.split_seed!r}")
        self.stdout.write(
            "  tasks: "
            + ", ".join(f"{split} {count}" for split, count in counts.items())
            + f" (total {sum(counts.values())})"
        )

    def _progress(self, done: int, total: int, key: str) -> None:
        self.stdout.write(f"  checked {done}/{total}: {key}")

    def _report(self, report: ImportReport) -> None:
        refused = f", refused {len(report.refused)}" if report.refused else ""
        self.stdout.write(f"tasks taken: {len(report.taken)}{refused}")
        for key, reason in report.refused:
            self.stdout.write(f"  refused {key}: {reason}")
        for key, warning in report.warnings:
            self.stdout.write(f"  warning {key}: {warning}")
