"""The training loop: shuffled batches, the loss on the model turn only, AdamW, a time limit.

The loss is computed on the positions that predict a completion token only: the final hidden
states of those positions go through the output layer, not the whole sequence's. Gemma 3's
vocabulary has 262,144 entries, so full logits for a batch of 4 x 512 tokens would take 2 GiB
(and as much again for their gradient) and most of a step's time.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from coevo.training.cpu_lora.rows import Sequence


@dataclass
class Trained:
    steps: int  # optimizer steps taken
    planned: int
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0
    stopped: str = ""  # why training stopped before the planned steps ("" if it did not)


def steps_planned(*, rows: int, batch_size: int, steps: int | None, epochs: float | None) -> int:
    if steps is not None:
        return steps
    return max(1, math.ceil((epochs or 1.0) * rows / batch_size))


def batches(sequences: list[Sequence], *, batch_size: int, seed: int) -> Iterator[list[Sequence]]:
    """Batches for ever: each pass over the rows in a new order drawn from ``seed``."""
    order = random.Random(seed)
    while True:
        indices = list(range(len(sequences)))
        order.shuffle(indices)
        for start in range(0, len(indices), batch_size):
            yield [sequences[i] for i in indices[start : start + batch_size]]


def batch_tensors(batch: list[Sequence], *, pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ids, their attention mask, and the mask of positions whose next token is
    part of a model turn (the positions the loss is taken at)."""
    width = max(len(s.ids) for s in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    predicts = torch.zeros((len(batch), width), dtype=torch.bool)
    for row, sequence in enumerate(batch):
        n = len(sequence.ids)
        ids[row, :n] = torch.tensor(sequence.ids, dtype=torch.long)
        attention[row, :n] = 1
        # Position t predicts token t + 1: the turn's first token is predicted at its end.
        predicts[row, max(sequence.prompt_tokens, 1) - 1 : n - 1] = True
    return {"ids": ids, "attention": attention, "predicts": predicts}


def batch_loss(model: Any, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean cross-entropy over the batch's model-turn tokens."""
    base = model.get_base_model()  # the LoRA layers are inside it
    hidden = base.get_decoder()(
        input_ids=tensors["ids"], attention_mask=tensors["attention"], use_cache=False
    ).last_hidden_state
    predicts = tensors["predicts"]
    targets = torch.roll(tensors["ids"], shifts=-1, dims=1)[predicts]
    logits = base.get_output_embeddings()(hidden[predicts]).float()
    softcap = getattr(base.config, "final_logit_softcapping", None)
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    return F.cross_entropy(logits, targets)


def lora_train(
    model: Any,
    sequences: list[Sequence],
    *,
    steps: int,
    batch_size: int,
    learning_rate: float,
    seed: int,
    pad_id: int,
    deadline: float | None,
    log: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
) -> Trained:
    """Train ``model``'s trainable parameters for ``steps`` steps, or fewer when the next step
    would end past ``deadline`` (a ``clock`` value): what was trained is kept."""
    model.train()
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=learning_rate, weight_decay=0.0)
    source = batches(sequences, batch_size=batch_size, seed=seed)
    result = Trained(steps=0, planned=steps)
    started = clock()
    last_step_s = 0.0
    for step in range(1, steps + 1):
        now = clock()
        # The next step will take about as long as the last one; stop before it if it would end
        # past the limit, so the adapter is saved in time.
        if deadline is not None and now + 1.2 * last_step_s > deadline:
            result.stopped = (
                f"the time limit leaves no time for step {step} (about {last_step_s:.1f} s)"
            )
            break
        tensors = batch_tensors(next(source), pad_id=pad_id)
        loss = batch_loss(model, tensors)
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"the loss is {loss.item()} at step {step}: lower --learning-rate"
            )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()
        last_step_s = clock() - now
        result.steps = step
        result.losses.append(loss.item())
        tokens = int(tensors["predicts"].sum())
        log(
            f"step {step}/{steps} loss {loss.item():.4f} ({tokens} target tokens, "
            f"{tensors['ids'].shape[0]}x{tensors['ids'].shape[1]}) {last_step_s:.2f} s/step"
        )
    result.seconds = clock() - started
    model.eval()
    return result
