#!/usr/bin/env python3
"""Supervised fine-tuning of a LoRA adapter on a coevo trajectory export, with TRL and PEFT.

An example trainer for alternating campaigns (docs/training.md). Register it once, as an
operator, on the machine that runs the training worker:

    python manage.py trainer_register trl-sft-lora --time-limit 3600 -- \\
        python /app/examples/trainers/trl_sft_lora.py \\
            --export {export} --format {format} --base-model {base_model} \\
            --parent-adapter {parent_adapter} --output-dir {output_dir} --run-dir {run_dir}

Each of those options defaults to the environment variable coevo sets for the run
(COEVO_EXPORT_PATH, COEVO_EXPORT_FORMAT, COEVO_BASE_MODEL, COEVO_PARENT_ADAPTER,
COEVO_OUTPUT_DIR, COEVO_RUN_DIR), so the bare command works as well.

What it does:

1. Reads the export. Chat rows are ``{"messages": [..., {"role": "assistant", "content": …,
   "weight": w}], "weight": w, "provenance": {…}}``: the last message is the model turn the row
   teaches, the messages before it are its prompt. Prompt/completion rows are ``{"prompt",
   "completion", "weight", "provenance"}``. Rows whose weight is 0 (turns of failed rollouts,
   or turns outside ``last_turns``) are dropped: supervised fine-tuning has no use for
   negatives. Rows longer than ``--max-length`` tokens are dropped too (truncating them would
   cut off the very turn they teach).
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

Needs torch, transformers>=4.56, datasets, peft>=0.13 and trl>=0.20 (not coevo dependencies: the
training worker's image adds them, docs/training.md). Exit status: 0 when the adapter is written,
2 for unusable input, 3 when a library is missing or too old.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REQUIRED = {"torch": None, "transformers": "4.56", "datasets": None, "peft": "0.13", "trl": "0.20"}
INSTALL_HINT = "pip install torch 'transformers>=4.56' datasets 'peft>=0.13' 'trl>=0.20'"
DEFAULT_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
EXIT_BAD_INPUT = 2
EXIT_MISSING_LIBRARY = 3


class BadInput(Exception):
    """The export or the options cannot be trained on (exit status 2)."""


# --- options ---------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(
        description="Train a LoRA adapter on a coevo trajectory export (TRL SFT + PEFT)."
    )
    io = parser.add_argument_group("coevo's inputs (default: the COEVO_* environment)")
    io.add_argument("--export", default=env("COEVO_EXPORT_PATH"), help="the export's JSONL")
    io.add_argument(
        "--format",
        default=env("COEVO_EXPORT_FORMAT", "chat"),
        choices=["chat", "prompt_completion"],
        help="the export's format",
    )
    io.add_argument("--base-model", default=env("COEVO_BASE_MODEL"), help="the policy's base")
    io.add_argument(
        "--parent-adapter",
        default=env("COEVO_PARENT_ADAPTER", ""),
        help="the parent policy's adapter directory ('' when the parent is the base model)",
    )
    io.add_argument("--output-dir", default=env("COEVO_OUTPUT_DIR"), help="write the adapter here")
    io.add_argument(
        "--run-dir", default=env("COEVO_RUN_DIR"), help="scratch space (trainer checkpoints)"
    )

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

    for name in ("export", "base_model", "output_dir"):
        if not getattr(args, name):
            flag = "--" + name.replace("_", "-")
            parser.error(f"{flag} is required (coevo passes it, or sets its COEVO_* variable)")
    if args.rank < 1 or args.alpha < 1 or args.batch_size < 1 or args.grad_accum < 1:
        parser.error("--rank, --alpha, --batch-size and --grad-accum must be positive")
    return args


# --- the export ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Example:
    """One training pair: ``prompt`` is text (plain) or a list of messages (chat)."""

    prompt: str | list[dict[str, str]]
    completion: str


@dataclass
class ReadCounts:
    rows: int = 0
    kept: int = 0
    zero_weight: int = 0


def _text(content: Any) -> str:
    """A message's content as text (OpenAI content parts are joined)."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content)


def _messages(raw: Any, where: str) -> list[dict[str, str]]:
    if not isinstance(raw, list) or not all(isinstance(m, dict) for m in raw):
        raise BadInput(f"{where}: expected a list of messages")
    # Only role and content: the per-turn "weight" is coevo's, not the chat template's.
    return [{"role": str(m.get("role", "")), "content": _text(m.get("content"))} for m in raw]


def _weight(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadInput(f"{where}: weight must be a number, not {value!r}")
    return float(value)


def _example_of(row: dict[str, Any], fmt: str, where: str) -> tuple[Example, float]:
    if fmt == "chat":
        if "messages" not in row:
            raise BadInput(
                f"{where}: a chat row needs 'messages' (is the export prompt_completion?)"
            )
        messages = row["messages"]
        if not isinstance(messages, list) or not messages or not isinstance(messages[-1], dict):
            raise BadInput(f"{where}: 'messages' must end with the assistant turn")
        target = messages[-1]
        if target.get("role") != "assistant":
            raise BadInput(f"{where}: the last message is {target.get('role')!r}, not assistant")
        weight = _weight(target.get("weight", row.get("weight", 1)), where)
        return Example(_messages(messages[:-1], where), _text(target.get("content"))), weight
    if "prompt" not in row or "completion" not in row:
        raise BadInput(f"{where}: a prompt_completion row needs 'prompt' and 'completion'")
    weight = _weight(row.get("weight", 1), where)
    prompt, completion = row["prompt"], row["completion"]
    if isinstance(completion, list):  # conversational: [assistant message]
        completion = _text(completion[-1].get("content")) if completion else ""
    if isinstance(prompt, list):
        return Example(_messages(prompt, where), _text(completion)), weight
    return Example(_text(prompt), _text(completion)), weight


def read_export(path: Path, fmt: str) -> tuple[list[Example], ReadCounts]:
    """The export's rows with a positive weight, as prompt/completion examples."""
    if not path.is_file():
        raise BadInput(f"the export {path} does not exist")
    counts = ReadCounts()
    examples: list[Example] = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            where = f"{path.name} line {number}"
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise BadInput(f"{where}: not JSON ({exc})") from exc
            if not isinstance(row, dict):
                raise BadInput(f"{where}: expected a JSON object")
            counts.rows += 1
            example, weight = _example_of(row, fmt, where)
            if weight <= 0:
                counts.zero_weight += 1
                continue
            examples.append(example)
    counts.kept = len(examples)
    if counts.rows == 0:
        raise BadInput(f"the export {path} holds no rows")
    if not examples:
        raise BadInput(
            f"none of the export's {counts.rows} rows has a positive weight: there is nothing "
            "to imitate (the campaign's export keeps only successful rollouts by default)"
        )
    return examples, counts


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


def to_rows(examples: list[Example], style: str) -> tuple[list[dict[str, Any]], int]:
    """TRL prompt/completion rows in ``style``; also the count of examples that do not fit it."""
    rows: list[dict[str, Any]] = []
    unfit = 0
    for example in examples:
        prompt = example.prompt
        if style == "chat":
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
            unfit += 1
    return rows, unfit


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


def train(args: argparse.Namespace, examples: list[Example], counts: ReadCounts) -> None:
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
    rows, unfit = to_rows(examples, style)
    if unfit:
        print(
            f"dropped {unfit} row(s) with several prompt messages: plain style trains raw text "
            "(use --prompt-style chat for a chat harness)",
            flush=True,
        )
    fitting = [row for row in rows if _token_count(tokenizer, row, style) <= args.max_length]
    if len(fitting) < len(rows):
        print(
            f"dropped {len(rows) - len(fitting)} row(s) longer than --max-length "
            f"{args.max_length} tokens",
            flush=True,
        )
    if not fitting:
        raise BadInput("no row is left to train on (see the lines above)")
    print(
        f"training on {len(fitting)} of {counts.rows} row(s) ({counts.zero_weight} with weight "
        f"0), prompt style {style}",
        flush=True,
    )

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
        examples, counts = read_export(Path(args.export), args.format)
        print(
            f"read {counts.rows} row(s) from {args.export}: {counts.kept} with a positive weight",
            flush=True,
        )
        train(args, examples, counts)
    except BadInput as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


if __name__ == "__main__":
    sys.exit(main())
