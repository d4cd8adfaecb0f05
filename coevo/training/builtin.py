"""The trainers coevo ships, registered like any other (coevo.training.trainers): the CPU LoRA
trainer (coevo.training.cpu_lora), ``manage.py trainer_register_cpu_lora``."""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

from django.conf import settings

from coevo.errors import InvalidInput
from coevo.training.cpu_lora.libraries import libraries_message, libraries_missing
from coevo.training.cpu_lora.options import options_parse
from coevo.training.models import Trainer
from coevo.training.trainers import trainer_register

CPU_LORA_MODULE = "coevo.training.cpu_lora"
CPU_LORA_DESCRIPTION = "Built-in CPU trainer: LoRA SFT from the base model's GGUF file"
# The source tree that holds the coevo package this process runs (coevo/training/builtin.py).
SOURCE_ROOT = Path(__file__).resolve().parents[2]


def cpu_lora_command(*, options: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The argv: this Python running the trainer module on the run's inputs, then ``options``
    (the trainer's knobs, e.g. ["--steps", "20", "--rank", "16"]; later options win)."""
    return [
        sys.executable, "-m", CPU_LORA_MODULE,
        "--export", "{export}", "--format", "{format}",
        "--base-model", "{base_model}", "--parent-adapter", "{parent_adapter}",
        "--output-dir", "{output_dir}", "--run-dir", "{run_dir}",
        *options,
    ]  # fmt: skip


def cpu_lora_options_check(options: list[str] | tuple[str, ...]) -> None:
    """Parse ``options`` as the trainer will, so a typo is refused now, not at every run."""
    inputs = ["--export", "x", "--base-model", "x", "--output-dir", "x", "--gguf-dir", "x"]
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
            options_parse([*inputs, *options])
    except SystemExit as exc:
        said = errors.getvalue().strip().splitlines()
        raise InvalidInput(
            f"The CPU trainer refuses the options {' '.join(options)}: "
            f"{said[-1] if said else f'exit status {exc.code}'} "
            "(python -m coevo.training.cpu_lora --help lists them)."
        ) from None


def trainer_register_cpu_lora(
    *,
    name: str = "cpu-lora",
    replace: bool = False,
    time_limit_s: int = 3600,
    options: list[str] | tuple[str, ...] = (),
    description: str = CPU_LORA_DESCRIPTION,
) -> Trainer:
    """Register the built-in CPU trainer under ``name``. Refused when this Python lacks the
    ``train`` extra: the trainer runs with this same Python (sys.executable) on the training
    worker, which therefore needs the extra too."""
    missing = libraries_missing()
    if missing:
        raise InvalidInput(libraries_message(missing, sys.executable))
    cpu_lora_options_check(options)
    env = {
        # Where the base model's GGUF file is (the shipped Gemma 3 270M is assembled there).
        "COEVO_GGUF_DIR": str(settings.COEVO_GGUF_DIR),
        # The trainer's environment is not the worker's: without this, `-m` would find coevo
        # only when it is installed, and then perhaps another copy than this one.
        "PYTHONPATH": str(SOURCE_ROOT),
    }
    return trainer_register(
        name=name,
        command=cpu_lora_command(options=options),
        time_limit_s=time_limit_s,
        env=env,
        description=description,
        replace=replace,
    )


__all__ = [
    "CPU_LORA_MODULE",
    "cpu_lora_command",
    "cpu_lora_options_check",
    "trainer_register_cpu_lora",
]
