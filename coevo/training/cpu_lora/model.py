"""The base model loaded from its GGUF file, a LoRA on it (new, or the parent's continued), and
the adapter saved as PEFT writes it. Imports torch, transformers and peft: the program imports
this module only after checking they are installed (coevo.training.cpu_lora.libraries)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

CONFIG = "adapter_config.json"


class HFTokens:
    """A Hugging Face tokenizer as coevo.training.cpu_lora.rows.Tokens."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.bos_id = tokenizer.bos_token_id
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def chat(self, messages: list[dict[str, str]], *, generation_prompt: bool) -> str | None:
        if not self.tokenizer.chat_template:
            return None
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt
        )


def base_load(path: Path) -> tuple[Any, HFTokens]:
    """The model (float32, dequantized) and its tokenizer, both from the GGUF file."""
    # Progress bars would fill the run's live log with carriage returns (the GGUF loader's
    # tqdm bar obeys TQDM_DISABLE, which the program sets before importing it).
    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    model.config.use_cache = False  # training: no KV cache
    return model, HFTokens(tokenizer)


def lora_attach(
    model: Any,
    *,
    parent_adapter: Path | None,
    rank: int,
    alpha: float,
    dropout: float,
    targets: list[str],
) -> PeftModel:
    """A trainable LoRA on ``model``: the parent's (its rank and targets; the new adapter
    replaces it on the same base, adapters are not stacked) or a new one."""
    if parent_adapter is not None:
        return PeftModel.from_pretrained(model, str(parent_adapter), is_trainable=True)
    missing = sorted(set(targets) - {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()})
    if missing:
        raise ValueError(f"--targets names module(s) the model does not have: {', '.join(missing)}")
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=targets,
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def parent_adapter_check(directory: Path, *, base_model: str) -> dict[str, Any]:
    """The parent adapter's config, after checking it is a PEFT LoRA (raises ValueError)."""
    path = directory / CONFIG
    if not path.is_file():
        raise ValueError(
            f"the parent adapter {directory} has no {CONFIG}: this trainer continues PEFT "
            "adapters only (train from a policy version whose adapter PEFT wrote)"
        )
    config = json.loads(path.read_text())
    if not isinstance(config, dict) or str(config.get("peft_type", "")).upper() != "LORA":
        raise ValueError(f"the parent adapter {directory} is not a LoRA ({CONFIG})")
    trained_for = str(config.get("base_model_name_or_path") or "")
    if trained_for and _last(trained_for) != _last(base_model):
        raise ValueError(
            f"the parent adapter {directory} was trained on {trained_for!r}, not on "
            f"{base_model!r}: a LoRA only fits the base model it was trained on"
        )
    return config


def _last(name: str) -> str:
    # As coevo's adapter check compares them: "google/gemma-3-270m" fits "gemma-3-270m".
    return name.rstrip("/").rsplit("/", 1)[-1].lower()


def trainable_parameters(model: Any) -> tuple[int, int]:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in model.parameters())


def adapter_save(model: PeftModel, output_dir: Path, *, base_model: str) -> list[Path]:
    """``adapter_config.json`` and ``adapter_model.safetensors`` (float32) into ``output_dir``.

    The config names the base model as coevo registers it (coevo's adapter check compares it
    with the policy's base_model), not the folder the GGUF file was loaded from, and lists the
    target modules sorted (PEFT keeps a set, whose order varies between runs): the same
    training gives the same bytes, hence the same adapter sha256."""
    for config in model.peft_config.values():
        config.base_model_name_or_path = base_model
        if isinstance(config.target_modules, set):
            config.target_modules = sorted(config.target_modules)
    output_dir.mkdir(parents=True, exist_ok=True)
    # Embeddings are never trained here: "auto" would look for the base model's config.
    model.save_pretrained(str(output_dir), safe_serialization=True, save_embedding_layers=False)
    # PEFT's empty model card names the training machine's folders: not part of an adapter.
    (output_dir / "README.md").unlink(missing_ok=True)
    return sorted(p for p in output_dir.iterdir() if p.is_file())
