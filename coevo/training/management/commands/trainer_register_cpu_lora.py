"""Register coevo's built-in CPU LoRA trainer (docs/training.md, "The built-in CPU trainer").

    manage.py trainer_register_cpu_lora [--name cpu-lora] [--time-limit 3600] [--replace] \
        [-- --steps 20 --rank 16 ...]
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from coevo.errors import CoevoError
from coevo.training.builtin import CPU_LORA_DESCRIPTION, trainer_register_cpu_lora


class Command(BaseCommand):
    help = (
        "Register (or --replace) the built-in CPU LoRA trainer; arguments after -- are its "
        "options (python -m coevo.training.cpu_lora --help)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--name", default="cpu-lora", help="the trainer's name (cpu-lora)")
        parser.add_argument("--time-limit", type=int, default=3600, help="seconds (default 3600)")
        parser.add_argument("--description", default=CPU_LORA_DESCRIPTION)
        parser.add_argument("--replace", action="store_true", help="update an existing trainer")
        parser.add_argument("options", nargs="*", help="the trainer's options, after --")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            trainer = trainer_register_cpu_lora(
                name=options["name"],
                replace=options["replace"],
                time_limit_s=options["time_limit"],
                options=list(options["options"]),
                description=options["description"],
            )
        except CoevoError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"trainer {trainer.name}: {' '.join(trainer.command)}")
