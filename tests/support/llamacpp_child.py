"""A scripted stand-in for ``python -m llama_cpp.server``, for the llama.cpp host's tests
(``--child-command "python -m tests.support.llamacpp_child"``).

It takes llama_cpp.server's flags (``--model``, ``--model_alias``, ``--n_ctx``, ``--host``,
``--port``, ``--lora_path``) and serves the scripted OpenAI server as llama-cpp-python would:
``/v1/models`` lists the alias, ``/extras/tokenize/count`` counts words. Every completion
answers ``from <alias>`` (with ``+ <adapter file name>`` when it has a LoRA), so a test sees
which child answered. Scripted behaviour, by prompt: ``sleep <seconds>`` answers after that
long (a request in flight); ``die`` ends the process at once (a crash). A LoRA file that holds
``BROKEN`` makes it exit while starting, as llama.cpp does on an adapter it cannot load.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.openai_server import ScriptedOpenAIServer, ScriptedPolicy


@dataclass
class ChildPolicy(ScriptedPolicy):
    def reply_for_request(self, text: str, model: str | None) -> str:
        if text.startswith("sleep "):
            time.sleep(float(text.split()[1]))
        elif text == "die":
            os._exit(3)
        return self.default


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--model_alias", required=True)
    parser.add_argument("--n_ctx", type=int)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--lora_path")
    args = parser.parse_args()
    reply = f"from {args.model_alias}"
    if args.lora_path:
        if b"BROKEN" in Path(args.lora_path).read_bytes():
            print(f"llama_adapter_lora_init: failed to load {args.lora_path}", flush=True)
            sys.exit(1)
        reply += f" + {Path(args.lora_path).name}"
    policy = ChildPolicy(model=args.model_alias, default=reply, flavor="llama-cpp-python")
    server = ScriptedOpenAIServer(policy, port=args.port)
    print(f"serving {args.model_alias} on {args.port}", flush=True)
    server._server.serve_forever()


if __name__ == "__main__":
    main()
