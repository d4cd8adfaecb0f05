"""mini-swe-agent, the SWE-agent team's minimal bash agent, unmodified, on a workspace task.

The agent is the release pinned in requirements.txt (the worker builds it with uv); this file
is only the glue its own `mini` command would otherwise be: it reads the task and the knobs,
loads one of mini-swe-agent's own config files (config/, copies of the package's defaults),
builds its DefaultAgent on its LiteLLM model and an environment, runs it on the instruction,
and prints a summary. The agent's model calls go to the rollout's boundary ($OPENAI_BASE_URL,
$OPENAI_API_KEY) through LiteLLM's `openai/` route; its bash commands run in the workspace
(/app) through the suite's exec helper ($COEVO_HELPERS_URL/exec), so each is in the trace.

Hidden tests judge the workspace when the program exits; nothing needs to be answered.
"""

from __future__ import annotations

import json
import os
import traceback
import urllib.request
from pathlib import Path

# mini-swe-agent and LiteLLM read these when they are imported, so they are set first:
os.environ.update(
    {
        # The sandbox reaches nothing but the boundary: LiteLLM uses its bundled price list
        # and never fetches one (or a tokenizer, or a check) from the internet.
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_OFFLINE_MODE": "true",
        # The policy is in no price list: its cost is 0, not an error that stops the agent.
        "MSWEA_COST_TRACKING": "ignore_errors",
        # The boundary retries the policy server itself; what reaches the agent is a refusal
        # (a limit, a request the server cannot serve) that the same request would get again.
        "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1",
        # No banner, and its global config (an .env it would load) in the private /tmp:
        # everything else is read-only.
        "MSWEA_SILENT_STARTUP": "1",
        "MSWEA_GLOBAL_CONFIG_DIR": "/tmp/mini-swe-agent",
    }
)

import litellm  # noqa: E402
import yaml  # noqa: E402
from minisweagent import __version__  # noqa: E402
from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.environments.local import LocalEnvironment  # noqa: E402
from minisweagent.models import get_model  # noqa: E402
from minisweagent.utils.serialize import recursive_merge  # noqa: E402

HERE = Path(__file__).resolve().parent
# The knob `protocol`: which of mini-swe-agent's own configs, and its model class unless the
# config names one (as `mini --model-class` would).
PROTOCOLS = {
    # What `mini` runs since v2: one `bash` tool, called by function calling.
    "tool_calls": ("mini.yaml", "litellm"),
    # v1's protocol: one ```mswea_bash_command block in the reply's text (any chat server).
    "text": ("mini_textbased.yaml", "litellm_textbased"),
}
MODEL = "openai/mini-swe-agent"  # LiteLLM's OpenAI route; any name: the policy answers
# Its price lookup fails for that name on every call (the cost is then 0, see above) and would
# print a "Provider List" banner into stdout each time.
litellm.suppress_debug_info = True


class ExecHelperEnvironment(LocalEnvironment):
    """LocalEnvironment, with each command run by the suite's exec helper instead of a
    subprocess of this sandbox: in /app, in a sandbox of its own, in the rollout's trace with
    its output, as one step against max_steps. What the agent sees is what LocalEnvironment
    returns (stdout and stderr together, the exit status; -1 and the reason when it timed
    out), and `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` still ends the run."""

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict:
        command = action.get("command", "")
        timeout = timeout or self.config.timeout
        result = exec_helper(command, timeout_s=timeout)
        output = (result.get("stdout") or "") + (result.get("stderr") or "")
        if result.get("timed_out") or result.get("exit_code") is None:
            why = result.get("killed") or f"Command '{command}' timed out after {timeout} seconds"
            reply = {
                "output": output,
                "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {why}",
                "extra": {"exception_type": "TimeoutExpired", "exception": why},
            }
        else:
            reply = {"output": output, "returncode": result["exit_code"], "exception_info": ""}
        self._check_finished(reply)
        return reply


def exec_helper(command: str, *, timeout_s: float) -> dict:
    request = urllib.request.Request(
        os.environ["COEVO_HELPERS_URL"] + "/exec",
        data=json.dumps({"command": command, "timeout_s": timeout_s}).encode(),
        headers={
            "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"],
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(request, timeout=timeout_s + 60) as response:
        return json.load(response)


def build_config(knobs: dict, workspace: str) -> dict:
    """mini-swe-agent's config (its agent, model and environment sections): the file the knob
    `protocol` names, with the knobs over it."""
    filename, model_class = PROTOCOLS[knobs["protocol"]]
    config = yaml.safe_load((HERE / "config" / filename).read_text())
    model_kwargs = {"temperature": knobs["temperature"], "max_tokens": knobs["max_tokens"]}
    return recursive_merge(
        {"model": {"model_class": model_class}},
        config,
        {
            "agent": {
                "step_limit": knobs["step_limit"],
                # Costs are 0 (no price list knows the policy): the rollout's limits bound it.
                "cost_limit": 0,
                "max_consecutive_format_errors": knobs["max_format_errors"],
            },
            "model": {"model_name": MODEL, "model_kwargs": model_kwargs},
            "environment": {"cwd": workspace, "timeout": knobs["command_timeout_s"]},
        },
    )


def main() -> None:
    task = json.loads(Path(os.environ["COEVO_TASK_FILE"]).read_text())
    knobs = json.loads(Path(os.environ["COEVO_KNOBS_FILE"]).read_text())
    workspace = os.environ.get("COEVO_WORKSPACE") or task.get("workspace") or "/app"
    config = build_config(knobs, workspace)
    environment = {k: v for k, v in config["environment"].items() if k != "environment_class"}
    if knobs["environment"] == "exec_helper":
        env = ExecHelperEnvironment(**environment)
    else:
        env = LocalEnvironment(**environment)
    agent = DefaultAgent(get_model(config=config["model"]), env, **config["agent"])
    try:
        result = agent.run(task["instruction"])
    except Exception as exc:
        # As mini-swe-agent's own batch runner (run/benchmarks/swebench.py) does: the run ends
        # with the exception's name as its exit status, and the workspace is judged as it is.
        # A call the policy server refuses (a conversation past its context) ends it so.
        traceback.print_exc()
        result = {"exit_status": type(exc).__name__, "submission": ""}
    summary = {
        "agent": f"mini-swe-agent {__version__}",
        "exit_status": result.get("exit_status", ""),
        "model_calls": agent.n_calls,
        "submission": (result.get("submission") or "")[-2000:],
    }
    print(json.dumps(summary))  # stdout's tail is kept in the trace
    Path(os.environ["COEVO_ANSWER_FILE"]).write_text(json.dumps(summary))


if __name__ == "__main__":
    main()
