"""The base model loaded from its GGUF file, a LoRA on it (new, or the parent's continued), and
the adapter saved as PEFT writes it. Imports torch, transformers and peft: the program imports
this module only after checking they are installed (coevo.training.cpu_lora.libraries)."""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from coevo.training.cpu_lora.base_cache import WEIGHTS, base_cache_dir

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


# Beside the GGUF file: its dequantized weights (float32), config and tokenizer as transformers
# saves them (where: coevo.training.cpu_lora.base_cache, which a local vLLM serves too).
# Reading the GGUF file costs about a minute on 2 cores (its metadata is parsed once for the
# config, once for the tokenizer and once for the weights, which are then dequantized); the
# cache loads in about a second (the weights are memory-mapped). The price is disk: four bytes
# a parameter (about 1 GiB for Gemma 3 270M).


def base_load(path: Path, *, cache: bool = True) -> tuple[Any, HFTokens, str]:
    """The model (float32, dequantized) and its tokenizer from the GGUF file, or from its cache
    when there is one; also where they came from ("cache", "GGUF file", or a note when the cache
    could not be written)."""
    # Progress bars would fill the run's live log with carriage returns (the GGUF loader's also
    # needs TQDM_DISABLE, which the program sets before importing it).
    hf_logging.disable_progress_bar()
    cached = base_cache_dir(path)
    if cache and (cached / WEIGHTS).is_file():
        tokenizer = AutoTokenizer.from_pretrained(cached)
        model = AutoModelForCausalLM.from_pretrained(cached, dtype=torch.float32)
        source = f"cache {cached}"
    else:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32
        )
        source = "GGUF file"
        if cache:
            try:
                _cache_write(cached, model, tokenizer)
                source += f" (cached in {cached} for the next run)"
            except OSError as exc:  # a read-only or full disk: train all the same
                source += f" (could not cache it in {cached}: {exc})"
    model.config.use_cache = False  # training: no KV cache
    return model, HFTokens(tokenizer), source


def _cache_write(target: Path, model: Any, tokenizer: Any) -> None:
    partial = target.parent / f".{target.name}.{os.getpid()}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    try:
        partial.mkdir(parents=True)
        output = model.get_output_embeddings()
        tied = output.weight is model.get_input_embeddings().weight
        output_name = next(name for name, module in model.named_modules() if module is output)
        state = {
            name: tensor.contiguous()
            for name, tensor in model.state_dict().items()
            # A tied output layer is the embedding: transformers ties it again on loading.
            if not (tied and name == f"{output_name}.weight")
        }
        save_file(state, str(partial / WEIGHTS), metadata={"format": "pt"})
        config = copy.deepcopy(model.config)
        config.architectures = [type(model).__name__]
        # Loaded from this cache, the weights are plain float32, not GGUF-quantized.
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.save_pretrained(str(partial))
        tokenizer.save_pretrained(str(partial))
        if target.exists():  # another run cached the same file meanwhile
            return
        # Caches of an earlier file of the same name go (each is as large as the weights).
        stem = target.name.rsplit("-", 2)[0]
        for old in target.parent.iterdir():
            if old.name.rsplit("-", 2)[0] == stem:
                shutil.rmtree(old, ignore_errors=True)
        # Whole or not at all: a run that looks sees the cache complete, or no cache.
        os.replace(partial, target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


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
