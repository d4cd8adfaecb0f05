"""``python -m coevo.training.cpu_lora``: read the export, load the base model, train, save.

Exit status: 0 when the adapter is written; 2 for unusable input (options, export, model file,
parent adapter; nothing left to train on); 3 when a library of the ``train`` extra is missing;
1 for anything else (the message says what). Every line of progress is flushed to stdout, which
the training worker streams into the run's live log.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
import warnings
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from coevo.errors import CoevoError
from coevo.policies.embedded import base_model_gguf
from coevo.training.cpu_lora.libraries import (
    EXIT_BAD_INPUT,
    EXIT_MISSING_LIBRARY,
    REQUIRED,
    libraries_message,
    libraries_missing,
)
from coevo.training.cpu_lora.options import options_parse
from coevo.training.cpu_lora.rows import BadInput, Example, RowCounts, rows_encode, rows_read

PREFIX = "cpu-lora: "
# The knobs summary.json records.
SUMMARY_OPTIONS = (
    "rank", "alpha", "dropout", "target_modules", "learning_rate", "max_length", "batch_size",
    "seed", "steps", "epochs", "prompt_style", "time_limit_s",
)  # fmt: skip


def log(message: str) -> None:
    print(PREFIX + message, flush=True)


def _versions() -> dict[str, str]:
    found = {}
    for name in REQUIRED:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "?"
    return found


def _threads(requested: int) -> int:
    if requested:
        return requested
    try:
        return len(os.sched_getaffinity(0))  # the cores this process may run on (cgroups, taskset)
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    args = options_parse(argv)
    deadline = started + args.time_limit_s if args.time_limit_s else None
    missing = libraries_missing()
    if missing:
        print(f"error: {libraries_message(missing, sys.executable)}", file=sys.stderr, flush=True)
        return EXIT_MISSING_LIBRARY
    try:
        examples, counts = rows_read(Path(args.export), args.format)
    except BadInput as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    log(f"read {counts.rows} row(s) from {args.export}: {len(examples)} with a positive weight")
    # The base model comes from its file, never from a hub (nothing is downloaded at run time).
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # Progress bars fill the live log with carriage returns; each step prints its own line.
    # (The GGUF loader's bar showed with either this or transformers' switch alone.)
    os.environ.setdefault("TQDM_DISABLE", "1")
    # Libraries' notices to their own developers (deprecated internals), not to the user.
    warnings.filterwarnings("ignore", category=FutureWarning)
    try:
        return _train(args, examples, counts, started, deadline)
    except BadInput as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return EXIT_BAD_INPUT
    except FloatingPointError as exc:  # the loss diverged: nothing worth saving
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    except ImportError as exc:  # installed, but broken (a torch built for another Python, say)
        message = libraries_message([exc.name or "a library"], sys.executable)
        print(f"error: {message} ({exc})", file=sys.stderr, flush=True)
        return EXIT_MISSING_LIBRARY


def _train(
    args: Any, examples: list[Example], counts: RowCounts, started: float, deadline: float | None
) -> int:
    # The train extra's heavy libraries, imported only once main() has found them.
    import torch

    from coevo.training.cpu_lora import loop, model

    threads = _threads(args.threads)
    torch.set_num_threads(threads)
    versions = _versions()
    log(
        f"python {platform.python_version()}, "
        + ", ".join(f"{k} {v}" for k, v in versions.items())
        + f"; {threads} thread(s)"
    )
    if args.model_path is not None:
        path = args.model_path
        if not path.is_file():
            raise BadInput(f"--model-path {path} is not a file")
    else:
        try:
            path = base_model_gguf(args.base_model, models_dir=args.gguf_dir)
        except CoevoError as exc:
            raise BadInput(str(exc)) from exc
    parent = Path(args.parent_adapter) if args.parent_adapter else None
    if parent is not None:
        try:
            parent_config = model.parent_adapter_check(parent, base_model=args.base_model)
        except (ValueError, OSError) as exc:
            raise BadInput(str(exc)) from exc

    log(f"loading the base model {args.base_model} from {path}")
    loading = time.monotonic()
    base, tokens, source = model.base_load(path, cache=not args.no_cache)
    log(f"loaded in {time.monotonic() - loading:.1f} s from the {source}")

    sequences = rows_encode(
        examples,
        tokens=tokens,
        max_length=args.max_length,
        prompt_style=args.prompt_style,
        counts=counts,
    )
    log(counts.used(len(sequences)))
    lengths = sorted(len(s.ids) for s in sequences)
    log(
        f"tokens per row: {lengths[0]} to {lengths[-1]} (median {lengths[len(lengths) // 2]}); "
        f"{sum(len(s.ids) - s.prompt_tokens for s in sequences)} model-turn token(s) in all"
    )

    # One seed for the LoRA's initial weights and dropout; the row order has its own draw.
    torch.manual_seed(args.seed)
    try:
        peft_model = model.lora_attach(
            base,
            parent_adapter=parent,
            rank=args.rank,
            alpha=args.alpha,
            dropout=args.dropout,
            targets=args.target_modules,
        )
    except ValueError as exc:
        raise BadInput(str(exc)) from exc
    trainable, total = model.trainable_parameters(peft_model)
    lora = peft_model.peft_config["default"]
    what = f"continuing the parent adapter {parent}" if parent is not None else "a new LoRA"
    if parent is not None:
        log(f"parent adapter: r={parent_config.get('r')}, {parent_config.get('target_modules')}")
    log(
        f"{what}: r={lora.r}, alpha={lora.lora_alpha}, on {', '.join(sorted(lora.target_modules))}; "
        f"{trainable:,} trainable parameter(s), {100 * trainable / total:.2f}% of {total:,}"
    )
    steps = loop.steps_planned(
        rows=len(sequences), batch_size=args.batch_size, steps=args.steps, epochs=args.epochs
    )
    log(
        f"training {steps} step(s) of {args.batch_size} row(s) "
        f"({steps * args.batch_size / len(sequences):.2f} epoch(s)), learning rate "
        f"{args.learning_rate:g}, seed {args.seed}"
        + (f", time limit {args.time_limit_s:g} s" if deadline else "")
    )
    trained = loop.lora_train(
        peft_model,
        sequences,
        steps=steps,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        seed=args.seed,
        pad_id=tokens.pad_id,
        deadline=deadline,
        log=log,
    )
    if trained.stopped:
        log(f"stopped after {trained.steps} of {steps} step(s): {trained.stopped}")
    if trained.steps == 0:
        print(
            f"error: the time limit ({args.time_limit_s:g} s) was reached before the first step; "
            "raise --time-limit-s (loading the model alone takes about a minute on 2 cores)",
            file=sys.stderr,
            flush=True,
        )
        return 1
    per_step = trained.seconds / trained.steps
    log(
        f"trained {trained.steps} step(s) in {trained.seconds:.1f} s ({per_step:.2f} s/step); "
        f"loss {trained.losses[0]:.4f} -> {trained.losses[-1]:.4f}"
    )
    output = Path(args.output_dir)
    files = model.adapter_save(peft_model, output, base_model=args.base_model)
    size = sum(f.stat().st_size for f in files)
    log(f"saved the adapter to {output}: {', '.join(f.name for f in files)} ({size:,} bytes)")
    summary = {
        "base_model": args.base_model,
        "model_path": str(path),
        "parent_adapter": args.parent_adapter,
        "rows": counts.rows,
        "rows_zero_weight": counts.zero_weight,
        "rows_dropped": dict(counts.dropped),
        "rows_trained": len(sequences),
        "steps": trained.steps,
        "steps_planned": steps,
        "stopped": trained.stopped,
        "losses": [round(x, 6) for x in trained.losses],
        "seconds_per_step": round(per_step, 3),
        "seconds": round(time.monotonic() - started, 1),
        "adapter_bytes": size,
        "options": {k: v for k, v in vars(args).items() if k in SUMMARY_OPTIONS},
        "versions": versions,
        "threads": torch.get_num_threads(),
    }
    run_dir = Path(args.run_dir) if args.run_dir else output.parent
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    log(f"done in {time.monotonic() - started:.1f} s")
    return 0
