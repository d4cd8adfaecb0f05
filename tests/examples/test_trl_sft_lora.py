"""examples/trainers/trl_sft_lora.py without its training libraries: it takes coevo's inputs
and reads the export the built-in CPU trainer's way (coevo.training.cpu_lora), turns the
examples into TRL rows, counting what it drops, and keeps its exit statuses (2 for unusable
input, 3 when a library, coevo included, is missing). The training itself needs a GPU stack
(torch, transformers, datasets, PEFT, TRL) that coevo's test environment does not install."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from coevo.training.builtin import SOURCE_ROOT
from coevo.training.cpu_lora.rows import Example, RowCounts
from tests.support.processes import run_trainer_python

SCRIPT = SOURCE_ROOT / "examples" / "trainers" / "trl_sft_lora.py"


def load_script():
    spec = importlib.util.spec_from_file_location("trl_sft_lora", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import would (dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


trl_sft_lora = load_script()


def run_script(*args: str, python_prefix: str = "pass") -> subprocess.CompletedProcess:
    """The script in a fresh Python with the environment its registration gives it (PATH and
    PYTHONPATH, docs/training.md); ``python_prefix`` runs first in that Python."""
    code = (
        f"{python_prefix}; import runpy, sys; sys.argv[0] = {str(SCRIPT)!r}; "
        f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')"
    )
    return run_trainer_python(code, *args)


def inputs(export: Path, out: Path) -> list[str]:
    return [
        "--export",
        str(export),
        "--base-model",
        "google/gemma-3-270m",
        "--output-dir",
        str(out),
    ]


def test_it_takes_coevos_inputs_from_the_environment(monkeypatch):
    monkeypatch.setenv("COEVO_EXPORT_PATH", "/exports/e.jsonl")
    monkeypatch.setenv("COEVO_EXPORT_FORMAT", "prompt_completion")
    monkeypatch.setenv("COEVO_BASE_MODEL", "google/gemma-3-270m")
    monkeypatch.setenv("COEVO_PARENT_ADAPTER", "/adapters/a")
    monkeypatch.setenv("COEVO_OUTPUT_DIR", "/runs/r/output")
    monkeypatch.setenv("COEVO_RUN_DIR", "/runs/r")

    args = trl_sft_lora.parse_args([])

    assert (args.export, args.format, args.base_model) == (
        "/exports/e.jsonl",
        "prompt_completion",
        "google/gemma-3-270m",
    )
    assert (args.parent_adapter, args.output_dir, args.run_dir) == (
        "/adapters/a",
        "/runs/r/output",
        "/runs/r",
    )


def test_it_exits_2_without_an_export(monkeypatch, capsys):
    monkeypatch.delenv("COEVO_EXPORT_PATH", raising=False)
    with pytest.raises(SystemExit) as exited:
        trl_sft_lora.parse_args(["--base-model", "m", "--output-dir", "out"])
    assert exited.value.code == 2
    assert "--export is required" in capsys.readouterr().err


def test_it_drops_tool_calls_and_conversations_in_plain_style_and_counts_them():
    text = Example("Q:", " A")
    user = Example([{"role": "user", "content": "Hi"}], "Hello")
    conversation = Example(
        [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}], "r"
    )
    tool_call = Example("Q:", "", tool_call=True)
    counts = RowCounts(rows=4)

    rows = trl_sft_lora.to_rows([text, user, conversation, tool_call], "plain", counts)

    assert rows == [
        {"prompt": "Q:", "completion": " A"},
        # How coevo exports a completions call in the chat format: the same raw text.
        {"prompt": "Hi", "completion": "Hello"},
    ]
    assert counts.used(len(rows)) == (
        "training on 2 of 4 row(s); dropped 1 with a tool call (this trainer learns text "
        "replies), 1 with several prompt messages (--prompt-style plain trains raw text)"
    )


def test_it_renders_every_prompt_as_messages_in_chat_style_but_not_tool_calls():
    counts = RowCounts(rows=2)
    rows = trl_sft_lora.to_rows(
        [Example("Q:", " A"), Example("Q:", "", tool_call=True)], "chat", counts
    )
    assert rows == [
        {
            "prompt": [{"role": "user", "content": "Q:"}],
            "completion": [{"role": "assistant", "content": " A"}],
        }
    ]
    assert sum(counts.dropped.values()) == 1


def test_it_exits_2_for_an_export_that_is_not_utf8_before_looking_for_its_libraries(tmp_path):
    export = tmp_path / "e.jsonl"
    export.write_bytes(b'{"prompt": "\xff", "completion": "b"}\n')
    done = run_script(*inputs(export, tmp_path / "out"), "--format", "prompt_completion")
    assert done.returncode == 2, done.stderr
    assert "error: e.jsonl line 1: not JSON" in done.stderr


def test_it_exits_2_when_no_row_has_a_positive_weight(tmp_path):
    export = tmp_path / "e.jsonl"
    export.write_text(json.dumps({"prompt": "a", "completion": "b", "weight": 0}) + "\n")
    done = run_script(*inputs(export, tmp_path / "out"), "--format", "prompt_completion")
    assert done.returncode == 2, done.stderr
    assert "error: none of the export's 1 row(s) has a positive weight" in done.stderr


def test_it_reads_the_export_then_exits_3_naming_what_to_install_when_trl_is_missing(tmp_path):
    export = tmp_path / "e.jsonl"
    export.write_text(json.dumps({"prompt": "a", "completion": "b", "weight": 1}) + "\n")
    done = run_script(
        *inputs(export, tmp_path / "out"),
        "--format",
        "prompt_completion",
        python_prefix="import sys; sys.modules['trl'] = None",
    )
    assert done.returncode == 3, done.stderr
    assert f"read 1 row(s) from {export}: 1 with a positive weight" in done.stdout
    assert "trl, which the training worker's Python" in done.stderr
    assert "'trl>=0.20'" in done.stderr
    assert not (tmp_path / "out").exists()


def test_it_exits_3_saying_how_to_run_it_when_coevo_cannot_be_imported(tmp_path):
    done = run_script(
        *inputs(tmp_path / "e.jsonl", tmp_path / "out"),
        python_prefix="import sys; sys.modules['coevo'] = None",
    )
    assert done.returncode == 3, done.stderr
    assert "cannot import it" in done.stderr
    assert "--env PYTHONPATH=/app" in done.stderr
