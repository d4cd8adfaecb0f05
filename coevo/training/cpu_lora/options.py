"""The CPU trainer's command line. coevo's inputs default to the ``COEVO_*`` environment the
training worker sets (coevo/training/process.py), so the bare command works as a trainer.
``inputs_add`` and ``inputs_check`` are those inputs alone; the example TRL trainer
(examples/trainers/trl_sft_lora.py) takes them the same way."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

DEFAULT_TARGETS = "q_proj,k_proj,v_proj,o_proj"
# coevo stops the command at the run's limit (SIGTERM, SIGKILL 10 s later) and ignores its
# output: stop training this long before it, to save the adapter and exit in time.
SAVE_MARGIN_S = 30.0


def _limit_default(value: str | None) -> float:
    try:
        limit = float(value) if value else 0.0
    except ValueError:
        return 0.0
    return max(1.0, limit - SAVE_MARGIN_S) if limit > 0 else 0.0


def inputs_add(parser: argparse.ArgumentParser) -> None:
    """coevo's inputs to a trainer (docs/training.md, "The trainer contract"), each defaulting
    to the ``COEVO_*`` variable the training worker sets for the run."""
    env = os.environ.get
    io = parser.add_argument_group("coevo's inputs (default: the COEVO_* environment)")
    io.add_argument("--export", default=env("COEVO_EXPORT_PATH"), help="the export's JSONL")
    io.add_argument(
        "--format",
        default=env("COEVO_EXPORT_FORMAT", "chat"),
        choices=["chat", "prompt_completion"],
        help="the export's format",
    )
    io.add_argument(
        "--base-model",
        default=env("COEVO_BASE_MODEL"),
        help="the parent policy's base model name; the adapter records it",
    )
    io.add_argument(
        "--parent-adapter",
        default=env("COEVO_PARENT_ADAPTER", ""),
        help="the parent policy's adapter directory ('' when the parent is the base model); "
        "training continues it",
    )
    io.add_argument("--output-dir", default=env("COEVO_OUTPUT_DIR"), help="write the adapter here")
    io.add_argument(
        "--run-dir", default=env("COEVO_RUN_DIR"), help="scratch space (summary.json goes here)"
    )


def inputs_check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exits 2 (argparse's usage error) when an input that has no default is missing."""
    for name in ("export", "base_model", "output_dir"):
        if not getattr(args, name):
            flag = "--" + name.replace("_", "-")
            parser.error(f"{flag} is required (coevo passes it, or sets its COEVO_* variable)")


def options_parse(argv: list[str] | None = None) -> argparse.Namespace:
    """Parsed options; argparse exits 2 (unusable input) on a bad or missing one."""
    env = os.environ.get
    parser = argparse.ArgumentParser(
        prog="python -m coevo.training.cpu_lora",
        # A registered typo ("--step") must not pass as an abbreviation of another option.
        allow_abbrev=False,
        description="Train a LoRA adapter on a coevo trajectory export, on the CPU, from the "
        "base model's GGUF file (docs/training.md, 'The built-in CPU trainer').",
    )
    inputs_add(parser)

    model = parser.add_argument_group("model")
    model.add_argument(
        "--model-path",
        type=Path,
        default=None,
        help="the base model's GGUF file (default: the one coevo serves --base-model from, "
        "found in --gguf-dir)",
    )
    model.add_argument(
        "--gguf-dir",
        type=Path,
        default=Path(env("COEVO_GGUF_DIR")) if env("COEVO_GGUF_DIR") else None,
        help="where base models' GGUF files are (default: COEVO_GGUF_DIR); the shipped Gemma 3 "
        "270M is assembled there on first use",
    )
    model.add_argument(
        "--no-cache",
        action="store_true",
        help="neither read nor write the dequantized copy of the GGUF file beside it "
        "(.cpu-lora-cache/: about 1 GiB for Gemma 3 270M; it loads in a second instead of a "
        "minute)",
    )
    model.add_argument(
        "--prompt-style",
        choices=["auto", "plain", "chat"],
        default="auto",
        help="train on raw text (plain: how a completions harness calls the model) or through "
        "the tokenizer's chat template (chat); auto: plain for text prompts and single user "
        "messages (how coevo exports a completions call), chat for longer conversations",
    )

    lora = parser.add_argument_group("LoRA (ignored when continuing a parent adapter)")
    lora.add_argument("--rank", type=int, default=8, help="r (default 8)")
    lora.add_argument("--alpha", type=float, default=16, help="lora_alpha (default 16)")
    lora.add_argument("--dropout", type=float, default=0.0, help="lora_dropout (default 0)")
    lora.add_argument(
        "--targets",
        default=DEFAULT_TARGETS,
        help=f"comma-separated module names (default the attention projections, {DEFAULT_TARGETS})",
    )

    train = parser.add_argument_group("training")
    length = train.add_mutually_exclusive_group()
    length.add_argument("--steps", type=int, default=None, help="optimizer steps")
    length.add_argument(
        "--epochs", type=float, default=None, help="passes over the rows (default 1)"
    )
    train.add_argument("--learning-rate", type=float, default=2e-4, help="AdamW, constant")
    train.add_argument(
        "--max-length",
        type=int,
        default=512,
        help="tokens per row, prompt included; longer rows are dropped (default 512)",
    )
    train.add_argument("--batch-size", type=int, default=4, help="rows per step (default 4)")
    train.add_argument("--seed", type=int, default=0, help="LoRA init, row order, dropout")
    train.add_argument(
        "--time-limit-s",
        type=float,
        default=_limit_default(env("COEVO_TIME_LIMIT_S")),
        help="stop before a step that would end past this many seconds from the start, and "
        f"save what was trained (default: the run's limit, COEVO_TIME_LIMIT_S, less "
        f"{SAVE_MARGIN_S:g} s to save in; 0: no limit)",
    )
    train.add_argument(
        "--threads", type=int, default=0, help="torch threads (default: the cores available)"
    )
    args = parser.parse_args(argv)

    inputs_check(parser, args)
    if args.model_path is None and args.gguf_dir is None:
        parser.error(
            "pass --model-path (the base model's GGUF file) or --gguf-dir (COEVO_GGUF_DIR)"
        )
    positive = {
        "--rank": args.rank,
        "--alpha": args.alpha,
        "--learning-rate": args.learning_rate,
        "--batch-size": args.batch_size,
        "--steps": 1 if args.steps is None else args.steps,
        "--epochs": 1 if args.epochs is None else args.epochs,
    }
    bad = [flag for flag, value in positive.items() if not value > 0]
    if bad:
        parser.error(f"{', '.join(bad)} must be positive")
    if args.max_length < 8:
        parser.error("--max-length must be at least 8 tokens")
    if not 0 <= args.dropout < 1:
        parser.error("--dropout must lie in [0, 1)")
    if args.time_limit_s < 0 or args.threads < 0:
        parser.error("--time-limit-s and --threads may not be negative")
    args.target_modules = [t.strip() for t in args.targets.split(",") if t.strip()]
    if not args.target_modules:
        parser.error("--targets names no module")
    if args.steps is None and args.epochs is None:
        args.epochs = 1.0
    return args
