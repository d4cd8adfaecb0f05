"""The built-in CPU trainer without a model: its options, the export's rows read and encoded
(both formats, every dropping rule), its exit statuses (2 for unusable input, 3 when the train
extra is missing: the program run for real, with a Python where `import torch` fails), and its
registration as a trainer. The training itself: test_cpu_lora_loop.py (a tiny model) and
test_cpu_lora_real.py (Gemma 3 270M)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from coevo.errors import InvalidInput
from coevo.training.builtin import CPU_LORA_MODULE, SOURCE_ROOT, trainer_register_cpu_lora
from coevo.training.cpu_lora.libraries import libraries_missing
from coevo.training.cpu_lora.options import SAVE_MARGIN_S, options_parse
from coevo.training.cpu_lora.rows import (
    BadInput,
    Example,
    RowCounts,
    Sequence,
    rows_encode,
    rows_read,
)
from coevo.training.models import Trainer, TrainingState
from coevo.training.services import training_run_execute
from coevo.training.trainers import PLACEHOLDERS
from tests.support.processes import run_trainer_python
from tests.training.support import make_run, make_trainer

REQUIRED = ["--export", "e.jsonl", "--base-model", "gemma-3-270m", "--output-dir", "out"]
MODEL = ["--model-path", "/models/gemma.gguf"]


class ByteTokens:
    """A tokenizer for the rules: one token per byte (ids 3..258), BOS 1, EOS 2; a chat
    template only when given one."""

    bos_id, eos_id = 1, 2

    def __init__(self, template: bool = False) -> None:
        self.template = template

    def encode(self, text: str) -> list[int]:
        return [b + 3 for b in text.encode()]

    def chat(self, messages, *, generation_prompt):
        if not self.template:
            return None
        text = "".join(f"<{m['role']}>{m['content']}</>" for m in messages)
        return text + ("<assistant>" if generation_prompt else "")


def write_rows(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def chat_row(prompt, reply: str, weight: float = 1, **extra) -> dict:
    messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    return {
        "messages": [*messages, {"role": "assistant", "content": reply, "weight": weight, **extra}],
        "weight": weight,
        "provenance": {"harness_sha": "abc"},
    }


def encode(examples, *, max_length=512, style="auto", template=False):
    counts = RowCounts(rows=len(examples))
    sequences = rows_encode(
        examples,
        tokens=ByteTokens(template),
        max_length=max_length,
        prompt_style=style,
        counts=counts,
    )
    return sequences, counts


# --- options ---------------------------------------------------------------------------------


def test_it_takes_coevos_inputs_from_the_environment(monkeypatch):
    for name, value in {
        "COEVO_EXPORT_PATH": "/exports/a.jsonl",
        "COEVO_EXPORT_FORMAT": "prompt_completion",
        "COEVO_BASE_MODEL": "gemma-3-270m",
        "COEVO_PARENT_ADAPTER": "/adapters/p",
        "COEVO_OUTPUT_DIR": "/runs/1/output",
        "COEVO_RUN_DIR": "/runs/1",
        "COEVO_GGUF_DIR": "/models",
        "COEVO_TIME_LIMIT_S": "600",
    }.items():
        monkeypatch.setenv(name, value)
    args = options_parse([])
    assert (args.export, args.format, args.base_model) == (
        "/exports/a.jsonl",
        "prompt_completion",
        "gemma-3-270m",
    )
    assert (args.parent_adapter, args.output_dir, args.run_dir) == (
        "/adapters/p",
        "/runs/1/output",
        "/runs/1",
    )
    assert args.gguf_dir == Path("/models") and args.model_path is None
    # It stops in time to save before coevo stops it.
    assert args.time_limit_s == 600 - SAVE_MARGIN_S
    assert (args.steps, args.epochs, args.rank, args.target_modules) == (
        None,
        1.0,
        8,
        ["q_proj", "k_proj", "v_proj", "o_proj"],
    )


def test_it_takes_its_knobs_from_the_command_line(monkeypatch):
    monkeypatch.delenv("COEVO_TIME_LIMIT_S", raising=False)
    args = options_parse(
        [*REQUIRED, *MODEL, "--steps", "7", "--rank", "16", "--alpha", "8", "--learning-rate",
         "1e-3", "--max-length", "256", "--batch-size", "2", "--seed", "5", "--targets",
         "q_proj, v_proj", "--prompt-style", "plain"]
    )  # fmt: skip
    assert (args.steps, args.epochs, args.rank, args.alpha) == (7, None, 16, 8)
    assert (args.learning_rate, args.max_length, args.batch_size, args.seed) == (1e-3, 256, 2, 5)
    assert args.target_modules == ["q_proj", "v_proj"] and args.prompt_style == "plain"
    assert args.model_path == Path("/models/gemma.gguf") and args.time_limit_s == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--export", "e", "--output-dir", "o", *MODEL], "--base-model is required"),
        (REQUIRED, "pass --model-path"),
        ([*REQUIRED, *MODEL, "--steps", "3", "--epochs", "2"], "not allowed with argument"),
        ([*REQUIRED, *MODEL, "--rank", "0"], "--rank must be positive"),
        ([*REQUIRED, *MODEL, "--max-length", "4"], "--max-length must be at least"),
        ([*REQUIRED, *MODEL, "--targets", " , "], "--targets names no module"),
        ([*REQUIRED, *MODEL, "--format", "csv"], "invalid choice"),
    ],
)
def test_it_refuses_unusable_options_with_status_2(monkeypatch, capsys, argv, message):
    for name in ("COEVO_BASE_MODEL", "COEVO_GGUF_DIR"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as exited:
        options_parse(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


# --- rows ------------------------------------------------------------------------------------


def test_it_reads_chat_rows_and_drops_those_of_weight_0(tmp_path):
    path = write_rows(
        tmp_path / "e.jsonl",
        [
            chat_row("task 1 call 0", "reply 0"),
            chat_row("task 2 call 0", "wrong", weight=0),
            chat_row(
                [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
                [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}],
            ),
        ],
    )
    examples, counts = rows_read(path, "chat")
    assert (counts.rows, counts.zero_weight) == (3, 1)
    assert examples == [
        Example([{"role": "user", "content": "task 1 call 0"}], "reply 0"),
        Example(
            [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            "Hello",
        ),
    ]


def test_it_reads_prompt_completion_rows_of_text_and_of_messages(tmp_path):
    path = write_rows(
        tmp_path / "e.jsonl",
        [
            {"prompt": "Q: 1+1?\nA:", "completion": " 2", "weight": 1, "provenance": {}},
            {"prompt": "Q: 2+2?\nA:", "completion": " 5", "weight": 0, "provenance": {}},
            {
                "prompt": [{"role": "user", "content": "Hi"}],
                "completion": [{"role": "assistant", "content": "Hello"}],
                "weight": 1,
                "provenance": {},
            },
        ],
    )
    examples, counts = rows_read(path, "prompt_completion")
    assert (counts.rows, counts.zero_weight) == (3, 1)
    assert examples == [
        Example("Q: 1+1?\nA:", " 2"),
        Example([{"role": "user", "content": "Hi"}], "Hello"),
    ]


@pytest.mark.parametrize(
    ("fmt", "rows", "message"),
    [
        ("chat", [], "holds no rows"),
        ("chat", [chat_row("a", "b", weight=0)], "none of the export's 1 row(s)"),
        ("chat", [{"prompt": "a", "completion": "b"}], "is the export prompt_completion?"),
        ("prompt_completion", [chat_row("a", "b")], "is the export chat?"),
        ("chat", [{"messages": [{"role": "user", "content": "a"}]}], "not assistant"),
        ("chat", [chat_row("a", "b", weight="1")], "weight must be a number"),
        ("chat", [[1, 2]], "expected a JSON object"),
        ("chat", [{"messages": None}], "is the export prompt_completion?"),
        ("prompt_completion", [{"prompt": "a", "completion": []}], "end with the assistant"),
        ("prompt_completion", [{"prompt": "a", "completion": ["b"]}], "end with the assistant"),
    ],
)
def test_it_refuses_an_export_it_cannot_train_on(tmp_path, fmt, rows, message):
    with pytest.raises(BadInput, match=re.escape(message)):
        rows_read(write_rows(tmp_path / "e.jsonl", rows), fmt)


def test_it_refuses_a_line_that_is_not_json(tmp_path):
    path = tmp_path / "e.jsonl"
    path.write_text('{"messages": [\n')
    with pytest.raises(BadInput, match="e.jsonl line 1: not JSON"):
        rows_read(path, "chat")


def test_it_refuses_a_line_that_is_not_utf8_as_not_json(tmp_path):
    path = tmp_path / "e.jsonl"
    path.write_bytes(b'{"prompt": "\xff", "completion": "b"}\n')
    with pytest.raises(BadInput, match="e.jsonl line 1: not JSON"):
        rows_read(path, "prompt_completion")


def test_it_trains_the_model_turn_of_plain_text_after_bos_and_before_eos():
    sequences, counts = encode(
        [Example("ab", "c"), Example([{"role": "user", "content": "ab"}], "c")]
    )
    # A completions call exported as one user message is the same raw text.
    assert sequences == [Sequence([1, 100, 101, 102, 2], 3)] * 2
    assert counts.used(2) == "training on 2 of 2 row(s)"


def test_it_renders_conversations_with_the_chat_template_and_drops_them_without_one():
    conversation = Example(
        [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}], "r"
    )
    sequences, _ = encode([conversation], template=True)
    prompt = "<system>s</><user>u</><assistant>"
    assert sequences == [Sequence(ByteTokens().encode(prompt + "r</>"), len(prompt))]

    sequences, counts = encode([Example("ab", "c"), conversation])
    assert len(sequences) == 1
    assert counts.dropped == {
        "with a conversation, and the tokenizer has no chat template to render it": 1
    }
    # --prompt-style plain trains raw text only; chat renders even a lone user message.
    _, counts = encode([Example("ab", "c"), conversation], style="plain", template=True)
    assert list(counts.dropped) == [
        "with several prompt messages (--prompt-style plain trains raw text)"
    ]
    sequences, _ = encode([Example("ab", "c")], style="chat", template=True)
    assert sequences[0].ids == ByteTokens().encode("<user>ab</><assistant>c</>")


def test_it_drops_rows_longer_than_the_maximum_length_and_tool_calls_and_says_how_many():
    fits = Example("a" * 5, "b")  # BOS + 5 + 1 + EOS = 8 tokens
    sequences, counts = encode(
        [fits, Example("a" * 6, "b"), Example("a" * 9, "b"), Example("q", "", tool_call=True)],
        max_length=8,
    )
    assert sequences == [Sequence([1, *[100] * 5, 101, 2], 6)]
    assert dict(counts.dropped) == {
        "longer than --max-length 8 tokens": 2,
        "with a tool call (this trainer learns text replies)": 1,
    }
    assert counts.used(1) == (
        "training on 1 of 4 row(s); dropped 2 longer than --max-length 8 tokens, "
        "1 with a tool call (this trainer learns text replies)"
    )
    with pytest.raises(BadInput, match="no row is left to train on"):
        encode([Example("a" * 9, "b")], max_length=8)


# --- the program's exit statuses -------------------------------------------------------------


def run_program(*args: str, python_prefix: str = "pass") -> subprocess.CompletedProcess:
    """``python -m coevo.training.cpu_lora`` in a fresh Python (as the training worker runs it);
    ``python_prefix`` runs first in that Python."""
    code = (
        f"{python_prefix}; import runpy; "
        f"runpy.run_module({CPU_LORA_MODULE!r}, run_name='__main__', alter_sys=True)"
    )
    return run_trainer_python(code, *args)


def test_it_exits_3_naming_the_extra_when_torch_is_missing(tmp_path):
    export = write_rows(tmp_path / "e.jsonl", [chat_row("a", "b")])
    # A Python where `import torch` fails, as where the train extra is not installed.
    done = run_program(
        "--export", str(export), "--base-model", "gemma-3-270m", "--output-dir",
        str(tmp_path / "out"), "--gguf-dir", str(tmp_path),
        python_prefix="import sys; sys.modules['torch'] = None",
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert "needs torch" in done.stderr
    assert "pip install 'coevo[train]'" in done.stderr
    assert "--index-url https://download.pytorch.org/whl/cpu" in done.stderr
    assert "pip install torch==2.13.0" in done.stderr
    assert not (tmp_path / "out").exists()


def test_it_exits_2_when_no_row_has_a_positive_weight(tmp_path):
    export = write_rows(tmp_path / "e.jsonl", [chat_row("a", "b", weight=0)])
    done = run_program(
        "--export", str(export), "--base-model", "gemma-3-270m", "--output-dir",
        str(tmp_path / "out"), "--gguf-dir", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "error: none of the export's 1 row(s) has a positive weight" in done.stderr


def test_it_exits_2_when_the_base_model_has_no_gguf_file(tmp_path):
    export = write_rows(tmp_path / "e.jsonl", [chat_row("a", "b")])
    done = run_program(
        "--export", str(export), "--base-model", "org/other-model", "--output-dir",
        str(tmp_path / "out"), "--gguf-dir", str(tmp_path),
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert f"expected {tmp_path}/other-model.gguf" in done.stderr
    assert "cpu-lora: read 1 row(s)" in done.stdout


# --- registration ----------------------------------------------------------------------------


def test_it_registers_the_cpu_trainer_with_this_python_and_the_gguf_dir(db, settings, tmp_path):
    settings.COEVO_GGUF_DIR = tmp_path / "models"
    trainer = trainer_register_cpu_lora(time_limit_s=900, options=["--steps", "20"])
    trainer.refresh_from_db()
    assert trainer.name == "cpu-lora" and trainer.time_limit_s == 900
    assert trainer.command[:3] == [sys.executable, "-m", "coevo.training.cpu_lora"]
    assert trainer.command[-2:] == ["--steps", "20"]
    for placeholder in ("export", "format", "base_model", "parent_adapter", "output_dir"):
        assert "{" + placeholder + "}" in trainer.command
    assert trainer.env == {
        "COEVO_GGUF_DIR": str(tmp_path / "models"),
        "PYTHONPATH": str(SOURCE_ROOT),
    }
    assert (SOURCE_ROOT / "coevo" / "training" / "cpu_lora" / "__main__.py").is_file()

    with pytest.raises(InvalidInput, match="pass replace"):
        trainer_register_cpu_lora()
    trainer_register_cpu_lora(replace=True, options=["--rank", "4"])
    assert Trainer.objects.get(name="cpu-lora").command[-2:] == ["--rank", "4"]


def test_it_refuses_to_register_options_the_trainer_would_refuse(db):
    with pytest.raises(InvalidInput, match=r"--step 3: .*unrecognized arguments: --step 3"):
        trainer_register_cpu_lora(options=["--step", "3"])
    with pytest.raises(InvalidInput, match="--rank must be positive"):
        trainer_register_cpu_lora(options=["--rank", "-1"])
    assert not Trainer.objects.exists()


def test_it_refuses_to_register_where_the_extra_is_missing(db, monkeypatch):
    # What importlib finds where torch is not installed.
    monkeypatch.setitem(sys.modules, "torch", None)
    assert libraries_missing() == ["torch"]
    with pytest.raises(InvalidInput, match=r"needs torch.*pip install 'coevo\[train\]'"):
        trainer_register_cpu_lora()
    with pytest.raises(CommandError, match="needs torch"):
        call_command("trainer_register_cpu_lora")
    assert not Trainer.objects.exists()


def test_the_command_registers_the_cpu_trainer_with_options(db, capsys):
    call_command(
        "trainer_register_cpu_lora", "--name", "cpu-small", "--time-limit", "600",
        "--", "--steps", "3", "--rank", "4",
    )  # fmt: skip
    trainer = Trainer.objects.get(name="cpu-small")
    assert trainer.time_limit_s == 600
    assert trainer.command[-4:] == ["--steps", "3", "--rank", "4"]
    assert "trainer cpu-small: " in capsys.readouterr().out


# --- the run's time limit, for every trainer -------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_trainer_is_told_its_runs_time_limit(project, owner, export, base_policy):
    assert PLACEHOLDERS["time_limit_s"] == "COEVO_TIME_LIMIT_S"
    # The tiny trainer prints one line per epoch: as many as the run has seconds.
    trainer = make_trainer("--epochs", "{time_limit_s}", time_limit_s=120)
    run = make_run(project, owner, export, base_policy, trainer=trainer, time_limit_s=45)
    run = training_run_execute(run_id=run.id)
    assert run.state == TrainingState.SUCCEEDED, run.state_detail
    assert "epoch 45/45 " in run.log_tail
    assert "--epochs" in run.command and "45" in run.command
