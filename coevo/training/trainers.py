"""Trainers: operator-registered commands (``manage.py trainer_register`` or the admin), the
checks every way of defining one shares, and looking one up by name."""

from __future__ import annotations

import string
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction

from coevo.audit.services import audit_record
from coevo.errors import InvalidInput
from coevo.training.models import Trainer

# The placeholders a trainer's argv may use, and the environment variable carrying each.
PLACEHOLDERS = {
    "export": "COEVO_EXPORT_PATH",
    "format": "COEVO_EXPORT_FORMAT",
    "base_model": "COEVO_BASE_MODEL",
    "parent_adapter": "COEVO_PARENT_ADAPTER",
    "output_dir": "COEVO_OUTPUT_DIR",
    "run_dir": "COEVO_RUN_DIR",
    # The run's own limit (a campaign may lower the trainer's): a trainer that knows it can
    # stop in time and still save, instead of being killed with nothing to show.
    "time_limit_s": "COEVO_TIME_LIMIT_S",
}
MAX_TIME_LIMIT_S = 7 * 24 * 3600


def trainer_register(
    *,
    name: str,
    command: list[str],
    time_limit_s: int = 3600,
    env: dict[str, str] | None = None,
    description: str = "",
    replace: bool = False,
) -> Trainer:
    """Register (or, with ``replace``, update) a trainer. Operators only: the command runs on
    the training worker outside any sandbox."""
    env = env or {}
    trainer_validate(command=command, time_limit_s=time_limit_s, env=env)
    defaults = {
        "command": command,
        "time_limit_s": time_limit_s,
        "env": env,
        "description": description,
        "enabled": True,
    }
    with transaction.atomic():
        existing = Trainer.objects.select_for_update().filter(name=name).first()
        if existing is not None and not replace:
            raise InvalidInput(f"A trainer named {name} exists; pass replace to update it.")
        if existing is None:
            trainer = Trainer(name=name, **defaults)
            try:
                trainer.full_clean()
            except ValidationError as exc:
                raise InvalidInput(
                    "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())
                ) from exc
            trainer.save()
        else:
            for key, value in defaults.items():
                setattr(existing, key, value)
            existing.save()
            trainer = existing
        trainer_audit(trainer=trainer, actor=None, action="trainer.registered")
    return trainer


def trainer_validate(*, command: Any, time_limit_s: int, env: Any) -> None:
    """What every way of defining a trainer (this module, the admin) checks first."""
    if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
        raise InvalidInput("A trainer's command is a non-empty list of strings (an argv).")
    for arg in command:
        _placeholders_check(arg)
    if not isinstance(time_limit_s, int) or not 1 <= time_limit_s <= MAX_TIME_LIMIT_S:
        raise InvalidInput(f"time_limit_s must lie in [1, {MAX_TIME_LIMIT_S}].")
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise InvalidInput("A trainer's env maps names to strings.")
    clashing = sorted(set(env) & set(PLACEHOLDERS.values()))
    if clashing:
        raise InvalidInput(f"env may not set {', '.join(clashing)}: coevo sets them per run.")


def trainer_audit(*, trainer: Trainer, actor: AbstractBaseUser | None, action: str) -> None:
    audit_record(
        actor=actor,
        project=None,
        action=action,
        target=trainer,
        after={
            "command": trainer.command,
            "time_limit_s": trainer.time_limit_s,
            "env": sorted(trainer.env),  # names only: values may be credentials
            "enabled": trainer.enabled,
        },
    )


def _placeholders_check(arg: str) -> None:
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(arg) if f is not None]
    except ValueError as exc:
        raise InvalidInput(f"Trainer argument {arg!r}: {exc} (write {{{{ for a brace).") from exc
    unknown = sorted({f for f in fields if f not in PLACEHOLDERS})
    if unknown:
        raise InvalidInput(
            f"Trainer argument {arg!r} uses unknown placeholder(s) {unknown}; known: "
            f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)}."
        )
    # Conversions and format specs ({export!z}, {export:d}) fail only when filled in: fill
    # it in now, so a bad one is refused here rather than failing every run.
    try:
        arg.format_map(dict.fromkeys(PLACEHOLDERS, "x"))
    except (ValueError, KeyError, IndexError) as exc:
        raise InvalidInput(f"Trainer argument {arg!r}: {exc} (write {{{{ for a brace).") from exc


def trainer_get(*, name: str) -> Trainer:
    trainer = Trainer.objects.filter(name=name).first()
    if trainer is None:
        known = ", ".join(Trainer.objects.filter(enabled=True).values_list("name", flat=True))
        raise InvalidInput(
            f"No trainer named {name!r} (registered: {known or 'none'}). An operator registers "
            "one with `manage.py trainer_register` (docs/training.md)."
        )
    if not trainer.enabled:
        raise InvalidInput(f"The trainer {name} is disabled.")
    return trainer


__all__ = [
    "MAX_TIME_LIMIT_S",
    "PLACEHOLDERS",
    "trainer_audit",
    "trainer_get",
    "trainer_register",
    "trainer_validate",
]
