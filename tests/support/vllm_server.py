"""A test server speaking vLLM's runtime LoRA endpoints, beside the scripted OpenAI server.

It answers like ``vllm serve BASE --enable-lora`` with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``:
``POST /v1/load_lora_adapter`` ``{"lora_name", "lora_path", "load_inplace"}`` answers plain
text on success, a JSON error (400, vLLM's body and words) when the name is already loaded
(unless ``load_inplace`` is true: then the new path replaces it) or the path holds no adapter;
``POST /v1/unload_lora_adapter`` ``{"lora_name"}`` answers 404 for an unknown name;
``GET /v1/models`` lists the base model and each loaded adapter with ``parent`` (the base) and
``root`` (its path); completions for a model name that is not loaded answer 404. With
``runtime_lora=False`` the LoRA endpoints do not exist (404), as in vLLM without the variable.
An adapter path loads, as in vLLM, when it is a directory holding an ``adapter_config.json``
with ``peft_type`` LORA and weights (``adapter_model.safetensors`` or ``.bin``).
``adapter_default``, when set, is what every loaded adapter answers (a "trained" policy that
behaves differently from its base).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.openai_server import ScriptedOpenAIServer, ScriptedPolicy, _Handler, _Server


@dataclass
class VLLMPolicy(ScriptedPolicy):
    model: str = "base-model"
    runtime_lora: bool = True
    adapters: dict[str, str] = field(default_factory=dict)
    # Accept a load but do not list the adapter afterwards (a server that misbehaves).
    forget_loads: bool = False
    adapter_default: str | None = None
    # A load that loses a race: just before it arrives, another worker's load of the same name
    # (and path) is done, so this one gets vLLM's "already loaded" 400.
    race: bool = False

    def reply_for_request(self, text: str, model: str | None) -> str:
        if self.adapter_default is not None and model in self.adapters:
            return self.adapter_default
        return self.reply_for(text)


def _adapter_problem(path: str) -> str:
    """Why vLLM would refuse to load ``path`` as a LoRA ("" when it loads)."""
    directory = Path(path)
    try:
        config = json.loads((directory / "adapter_config.json").read_text())
    except (OSError, ValueError):
        return f"No adapter found for {path}"
    if str(config.get("peft_type", "")).upper() != "LORA":
        return f"{path}: peft_type {config.get('peft_type')!r} is not LORA"
    if not any(
        (directory / name).is_file() for name in ("adapter_model.safetensors", "adapter_model.bin")
    ):
        return f"{path}: no adapter_model.safetensors or adapter_model.bin"
    return ""


def _error(message: str, code: int, kind: str = "BadRequestError") -> dict[str, Any]:
    """vLLM's error body (its ErrorResponse, as vLLM answered here in 2026: nested)."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


class _VLLMHandler(_Handler):
    policy: VLLMPolicy

    def _text(self, status: int, text: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.rstrip("/") != "/v1/models":
            return super().do_GET()
        policy = self.policy
        data = [{"id": policy.model, "object": "model", "root": policy.model, "parent": None}]
        with policy._lock:
            data += [
                {"id": name, "object": "model", "root": path, "parent": policy.model}
                for name, path in policy.adapters.items()
            ]
        self._json(200, {"object": "list", "data": data})

    def do_POST(self) -> None:
        policy = self.policy
        if self.path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            with policy._lock:
                policy.requests.append({"path": self.path, **body})
            if not policy.runtime_lora:
                self._json(404, {"detail": "Not Found"})
                return
            name = body.get("lora_name") or ""
            with policy._lock:
                if self.path == "/v1/load_lora_adapter":
                    path = body.get("lora_path") or ""
                    if policy.race:
                        policy.adapters[name], policy.race = path, False
                    if name in policy.adapters and body.get("load_inplace") is not True:
                        msg = (
                            f"The lora adapter '{name}' has already been loaded. If you want "
                            "to load the adapter in place, set 'load_inplace' to True."
                        )
                        self._json(400, _error(msg, 400, "InvalidUserInput"))
                    elif problem := _adapter_problem(path):
                        msg = f"Loading lora {name} failed: {problem}"
                        self._json(400, _error(msg, 400))
                    else:
                        if not policy.forget_loads:
                            policy.adapters[name] = path
                        self._text(200, f"Success: LoRA adapter '{name}' added successfully.")
                elif name not in policy.adapters:
                    self._json(404, _error(f"The lora adapter '{name}' cannot be found.", 404))
                else:
                    del policy.adapters[name]
                    self._text(200, f"Success: LoRA adapter '{name}' removed successfully.")
            return
        if self.path in ("/v1/completions", "/v1/chat/completions"):
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) or b"{}"
            model = json.loads(raw).get("model")
            if model != policy.model and model not in policy.adapters:
                self._json(404, _error(f"The model `{model}` does not exist.", 404))
                return
            # Hand the body back to the scripted handler, which reads it again.
            self.rfile = io.BytesIO(raw)
        return super().do_POST()


class VLLMTestServer(ScriptedOpenAIServer):
    def __init__(self, policy: VLLMPolicy | None = None, *, port: int = 0) -> None:
        self.policy = policy or VLLMPolicy()
        self._handler = type("Handler", (_VLLMHandler,), {"policy": self.policy})
        self._server: _Server | None = _Server(("127.0.0.1", port), self._handler)
        self.port = self._server.server_address[1]
        self._thread = None


def make_adapter(directory: Path, *, rank: int = 8) -> Path:
    """A directory that the test server (like vLLM) accepts as a LoRA adapter."""
    from tests.support.tiny_trainer import write_adapter

    write_adapter(directory, base="base-model", seed=str(directory).encode(), rank=rank)
    return directory
