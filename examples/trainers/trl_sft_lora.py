#!/usr/bin/env python3
"""Supervised fine-tuning of a LoRA adapter on a coevo trajectory export, with TRL and PEFT.

An example trainer for alternating campaigns (docs/training.md). Register it once, as an
operator, on the machine that runs the training worker:

    python manage.py trainer_register trl-sft-lora --time-limit 3600 --env PYTHONPATH=/app -- \\
        python /app/examples/trainers/trl_sft_lora.py \\
            --export {export} --format {format} --base-model {base_model} \\
            --parent-adapter {parent_adapter} --output-dir {output_dir} --run-dir {run_dir}

Each of those options defaults to the environment variable coevo sets for the run
(COEVO_EXPORT_PATH, COEVO_EXPORT_FORMAT, COEVO_BASE_MODEL, COEVO_PARENT_ADAPTER,
COEVO_OUTPUT_DIR, COEVO_RUN_DIR), so the bare command works as well.

It reads the export with coevo's own reader (coevo.training.cpu_lora.rows, the built-in CPU
trainer's), so it runs with a Python that imports coevo: the training worker's, with
``PYTHONPATH`` naming coevo's source tree (/app in the image; the trainer's environment is not
the worker's, docs/training.md).

What it does:

1. Reads the export. Chat rows are ``{"messages": [..., {"role": "assistant", "content": …,
   "weight": w}], "weight": w, "provenance": {…}}``: the last message is the model turn the row
   teaches, the messages before it are its prompt. Prompt/completion rows are ``{"prompt",
   "completion", "weight", "provenance"}``. Rows whose weight is 0 (turns of failed rollouts,
   or turns outside ``last_turns``) are dropped: supervised fine-tuning has no use for
   negatives. Rows longer than ``--max-length`` tokens are dropped too (truncating them would
   cut off the very turn they teach), and so are rows whose reply is a tool call (this trainer
   learns text replies).
2. Loads the base model (``--model-path``, by default the policy's base model). When the parent
   policy is itself an adapter, that adapter is loaded trainable and training continues it, so
   the new adapter replaces its parent on the same base; otherwise a fresh LoRA is created.
3. Trains with TRL's SFTTrainer on prompt/completion pairs: the loss covers the completion
   (the model turn) only.
4. Writes the adapter with PEFT's ``save_pretrained`` to the output directory:
   ``adapter_config.json`` and ``adapter_model.safetensors``, which is what coevo checks and
   vLLM loads. Trainer checkpoints stay in the run directory.

Prompt style. A harness with ``policy_api = "completions"`` (the seed harnesses) sends raw
text; a chat harness sends messages that vLLM formats with the chat template. Train the way the
policy is called: ``--prompt-style plain`` trains on the raw text (a chat row must then hold a
single user message, which is how coevo exports a completions call); ``chat`` applies the
tokenizer's chat template; ``auto`` (default) takes text prompts as plain and message prompts as
chat for a prompt_completion export, and for a chat export uses the chat template when the
tokenizer has one.

Needs coevo, and torch, transformers>=4.56, datasets, peft>=0.13 and trl>=0.20 (not coevo
dependencies: the training worker's image adds them, docs/training.md). Exit status: 0 when the
adapter is written, 2 for unusable input, 3 when a library (coevo included) is missing or too old.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

try:
    # Plain Python, no torch: importable before the training libraries are checked.
    from coevo.training.cpu_lora.libraries import EXIT_BAD_INPUT, EXIT_MISSING_LIBRARY
    from coevo.training.cpu_lora.options import inputs_add, inputs_check
    from coevo.training.cpu_lora.rows import (
        DROP_SEVERAL_MESSAGES,
        DROP_TOOL_CALL,
        BadInput,
        Example,
        RowCounts,
        drop_too_long,
        rows_read,
    )
except ImportError as exc:
    print(
        f"error: this trainer reads the export with coevo's reader, and {sys.executable} cannot "
        f"import it ({exc}). Run it with the training worker's Python, with PYTHONPATH set to "
        "coevo's source tree: register it with --env PYTHONPATH=/app in coevo's image "
        "(docs/training.md, 'Worked example: TRL SFT on Gemma 3 270M').",
        file=sys.stderr,
    )
    sys.exit(3)  # EXIT_MISSING_LIBRARY, which coevo itself defines

REQUIRED = {"torch": None, "transformers": "4.56", "datasets": None, "peft": "0.13", "trl": "0.20"}
INSTALL_HINT = "pip install torch 'transformers>=4.56' datasets 'peft>=0.13' 'trl>=0.20'"
DEFAULT_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


# --- options ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Train a LoRA adapter on a coevo trajectory export (TRL SFT + PEFT)."
    )
    inputs_add(parser)

    model = parser.add_argument_group("model")
    model.add_argument(
        "--model-path",
        default=None,
        help="load the base weights from this Hugging Face id or directory instead of "
        "--base-model (e.g. google/gemma-3-270m when coevo names the base gemma-3-270m); its "
        "last path component must still name the same model, or coevo refuses the adapter",
    )
    model.add_argument("--attn-implementation", default=None, help="e.g. eager, sdpa")
    model.add_argument(
        "--prompt-style",
        choices=["auto", "chat", "plain"],
        default="auto",
        help="train on raw text (plain) or through the chat template (chat); see the module doc",
    )

    lora = parser.add_argument_group("LoRA (ignored when continuing a parent adapter)")
    lora.add_argument(
        "--rank", type=int, default=16, help="r; at most the server's --max-lora-rank"
    )
    lora.add_argument("--alpha", type=int, default=32, help="lora_alpha")
    lora.add_argument("--dropout", type=float, default=0.05, help="lora_dropout")
    lora.add_argument(
        "--target-modules", default=DEFAULT_TARGETS, help="comma-separated module names"
    )

    train = parser.add_argument_group("training")
    train.add_argument("--epochs", type=float, default=1.0)
    train.add_argument("--learning-rate", type=float, default=1e-4)
    train.add_argument("--batch-size", type=int, default=4, help="per device")
    train.add_argument("--grad-accum", type=int, default=4, help="gradient accumulation steps")
    train.add_argument("--max-length", type=int, default=2048, help="tokens per example")
    train.add_argument("--gradient-checkpointing", action="store_true")
    train.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    inputs_check(parser, args)
    if args.rank < 1 or args.alpha < 1 or args.batch_size < 1 or args.grad_accum < 1:
        parser.error("--rank, --alpha, --batch-size and --grad-accum must be positive")
    return args


# --- the export's examples as TRL rows (coevo.training.cpu_lora.rows reads them) -------------


def choose_style(examples: list[Example], fmt: str, requested: str, has_template: bool) -> str:
    """'plain' or 'chat' for the whole dataset (TRL needs one format per dataset)."""
    if requested != "auto":
        return requested
    if fmt == "prompt_completion":
        kinds = {isinstance(e.prompt, list) for e in examples}
        if len(kinds) > 1:
            raise BadInput(
                "the export mixes text prompts and message prompts: pass --prompt-style plain "
                "or chat"
            )
        return "chat" if kinds == {True} else "plain"
    return "chat" if has_template else "plain"


def to_rows(examples: list[Example], style: str, counts: RowCounts) -> list[dict[str, Any]]:
    """TRL prompt/completion rows in ``style``; each example left out is counted in
    ``counts.dropped``."""
    rows: list[dict[str, Any]] = []
    for example in examples:
        prompt = example.prompt
        if example.tool_call:
            counts.dropped[DROP_TOOL_CALL] += 1
        elif style == "chat":
            messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
            rows.append(
                {
                    "prompt": messages,
                    "completion": [{"role": "assistant", "content": example.completion}],
                }
            )
        elif isinstance(prompt, str):
            rows.append({"prompt": prompt, "completion": example.completion})
        elif len(prompt) == 1 and prompt[0]["role"] == "user":
            # How coevo exports a completions call in the chat format: the prompt as one message.
            rows.append({"prompt": prompt[0]["content"], "completion": example.completion})
        else:
            counts.dropped[DROP_SEVERAL_MESSAGES] += 1
    return rows


# --- training --------------------------------------------------------------------------------


def require_libraries() -> dict[str, str]:
    """The training libraries' versions; exits 3 with what to install when one is missing."""
    missing = [name for name in REQUIRED if importlib.util.find_spec(name) is None]
    if missing:
        print(
            f"error: this trainer needs {', '.join(missing)}, which the training worker's Python "
            f"({sys.executable}) lacks. Install them into the trainer's image: {INSTALL_HINT} "
            "(docs/training.md, 'The trainer image').",
            file=sys.stderr,
        )
        sys.exit(EXIT_MISSING_LIBRARY)
    from importlib.metadata import version

    from packaging.version import Version

    versions = {name: version(name) for name in REQUIRED}
    old = [
        f"{name} {versions[name]} (needs >= {floor})"
        for name, floor in REQUIRED.items()
        if floor and Version(versions[name]) < Version(floor)
    ]
    if old:
        print(f"error: too old: {', '.join(old)}. {INSTALL_HINT}", file=sys.stderr)
        sys.exit(EXIT_MISSING_LIBRARY)
    return versions


def _token_count(tokenizer: Any, row: dict[str, Any], style: str) -> int:
    if style == "chat":
        text = tokenizer.apply_chat_template(row["prompt"] + row["completion"], tokenize=False)
    else:
        text = row["prompt"] + row["completion"]
    return len(tokenizer(text, add_special_tokens=False)["input_ids"]) + 2  # BOS and EOS


def train(args: argparse.Namespace, examples: list[Example], counts: RowCounts) -> None:
    versions = require_libraries()
    import torch
    from datasets import Dataset
    from peft import LoraConfig, PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer, set_seed
    from trl import SFTConfig, SFTTrainer

    print("versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()), flush=True)
    set_seed(args.seed)
    model_path = args.model_path or args.base_model
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    style = choose_style(examples, args.format, args.prompt_style, bool(tokenizer.chat_template))
    if style == "chat" and not tokenizer.chat_template:
        raise BadInput(
            f"--prompt-style chat, but the tokenizer of {model_path} has no chat template: "
            "train a completions harness's data with --prompt-style plain"
        )
    rows = to_rows(examples, style, counts)
    fitting = [row for row in rows if _token_count(tokenizer, row, style) <= args.max_length]
    if len(fitting) < len(rows):
        counts.dropped[drop_too_long(args.max_length)] += len(rows) - len(fitting)
    if not fitting:
        raise BadInput(f"no row is left to train on ({counts.used(0)})")
    print(f"prompt style {style}: {counts.used(len(fitting))}", flush=True)

    use_cuda = torch.cuda.is_available()
    bf16 = use_cuda and torch.cuda.is_bf16_supported()
    load_kwargs: dict[str, Any] = {"dtype": torch.bfloat16 if bf16 else torch.float32}
    if args.attn_implementation:
        load_kwargs["attn_implementation"] = args.attn_implementation
    model = AutoModelForCausalLM.from_pretrained(model_path, **load_kwargs)
    peft_config = None
    if args.parent_adapter:
        # Continue the parent's adapter (its rank and target modules): the new adapter replaces
        # it on the same base model, it is not stacked on top of it.
        model = PeftModel.from_pretrained(model, args.parent_adapter, is_trainable=True)
        print(f"continuing the parent adapter {args.parent_adapter}", flush=True)
    else:
        peft_config = LoraConfig(
            r=args.rank,
            lora_alpha=args.alpha,
            lora_dropout=args.dropout,
            target_modules=[m.strip() for m in args.target_modules.split(",") if m.strip()],
            bias="none",
            task_type="CAUSAL_LM",
        )

    run_dir = Path(args.run_dir) if args.run_dir else Path(args.output_dir).parent
    config = SFTConfig(
        output_dir=str(run_dir / "trl"),
        num_train_epochs=args.epochs,
        per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.grad_accum,
        learning_rate=args.learning_rate,
        max_length=args.max_length,
        completion_only_loss=True,
        packing=False,
        gradient_checkpointing=args.gradient_checkpointing,
        bf16=bf16,
        fp16=False,
        seed=args.seed,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,  # one log line per step instead of progress bars in coevo's log
    )
    trainer = SFTTrainer(
        model=model,
        args=config,
        train_dataset=Dataset.from_list(fitting),
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    started = time.monotonic()
    result = trainer.train()
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    trainer.model.save_pretrained(str(output))
    summary = {
        "rows": counts.rows,
        "trained_rows": len(fitting),
        "prompt_style": style,
        "model_path": model_path,
        "parent_adapter": args.parent_adapter,
        "train_loss": result.training_loss,
        "seconds": round(time.monotonic() - started, 1),
        "versions": versions,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"saved the adapter to {output}: {sorted(p.name for p in output.iterdir())}", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        examples, counts = rows_read(Path(args.export), args.format)
        print(
            f"read {counts.rows} row(s) from {args.export}: {len(examples)} with a positive weight",
            flush=True,
        )
        train(args, examples, counts)
    except BadInput as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


if __name__ == "__main__":
    sys.exit(main())
