"""Aider, the terminal pair programmer, unmodified, on a workspace task.

The agent is the release pinned in requirements.txt (the worker builds it with uv); this file is
only what a person at the terminal would otherwise type: it reads the task and the knobs, writes
Aider's model settings and metadata for the boundary's model, and starts Aider's own command line
(`aider.main.main`, what `python -m aider` runs) in the workspace (/app) with the workspace's
files in the chat and the instruction as its one message, answering yes to every question
(--yes-always). Aider's calls go to the rollout's boundary ($OPENAI_API_BASE, $OPENAI_API_KEY)
through LiteLLM's `openai/` route; the model answers in Aider's edit format, and Aider applies
the edits to the files itself.

Hidden tests judge the workspace when the program exits; the answer is a summary of the run.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

# Aider's home (~/.aider: its first-run record, analytics id, caches) and the chat's history
# files, in the private /tmp: the workspace gets only the edits.
STATE = Path("/tmp/aider")

# Aider and LiteLLM read these when they are imported, so they are set first:
os.environ.update(
    {
        "HOME": str(STATE),
        # The sandbox reaches nothing but the boundary: LiteLLM uses its bundled price list and
        # never fetches one.
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        # Aider offers to open a URL (a model warning's documentation, a URL in an error) and,
        # with --yes-always, would start a browser: this one is `true`, which opens nothing.
        "BROWSER": "true",
    }
)

from aider import __version__  # noqa: E402
from aider.coders.base_coder import Coder  # noqa: E402
from aider.commands import SwitchCoder  # noqa: E402
from aider.main import main as aider_main  # noqa: E402

MODEL = "openai/coevo"  # LiteLLM's OpenAI route; any name: the policy answers
SKIPPED_DIRS = {"__pycache__", "node_modules"}
MAX_FILE_BYTES = 100 * 1024


def workspace_files(root: Path, limit: int) -> list[str]:
    """The files Aider is given to edit: without git it knows no others. Hidden files and
    directories (.git, .venv, Aider's own), caches and large files are left out."""
    found = []
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in SKIPPED_DIRS)
        for name in sorted(files):
            path = Path(directory) / name
            if name.startswith(".") or not path.is_file() or path.is_symlink():
                continue
            if path.stat().st_size > MAX_FILE_BYTES:
                continue
            found.append(str(path.relative_to(root)))
            if len(found) == limit:
                return found
    return found


def model_files(knobs: dict) -> tuple[Path, Path]:
    """Aider's own configuration for the boundary's model, from the knobs: its metadata (the
    context window and costs LiteLLM does not know for this name: without them Aider fetches
    LiteLLM's price list from GitHub) and its settings (edit format, sampling)."""
    metadata = {
        MODEL: {
            "max_input_tokens": knobs["context_tokens"],
            "max_tokens": knobs["max_tokens"],
            "max_output_tokens": knobs["max_tokens"],
            # The policy is in no price list: its cost is 0.
            "input_cost_per_token": 0,
            "output_cost_per_token": 0,
            "litellm_provider": "openai",
            "mode": "chat",
        }
    }
    settings = [
        {
            "name": MODEL,
            "edit_format": knobs["edit_format"],
            "use_temperature": knobs["temperature"],
            "extra_params": {"max_tokens": knobs["max_tokens"]},
        }
    ]
    STATE.mkdir(parents=True, exist_ok=True)
    metadata_file, settings_file = STATE / "model-metadata.json", STATE / "model-settings.yml"
    metadata_file.write_text(json.dumps(metadata))
    settings_file.write_text(json.dumps(settings))  # JSON is YAML
    return metadata_file, settings_file


def aider_argv(knobs: dict, files: list[str]) -> list[str]:
    metadata_file, settings_file = model_files(knobs)
    return [
        *files,
        "--model",
        MODEL,
        "--edit-format",
        knobs["edit_format"],
        "--model-metadata-file",
        str(metadata_file),
        "--model-settings-file",
        str(settings_file),
        # Nobody is there to answer: yes to every question (a shell command Aider suggests
        # still needs an explicit yes, so it is not run).
        "--yes-always",
        # The workspace is not Aider's git repository: no repository, no commits.
        "--no-git",
        "--no-auto-commits",
        # What would reach outside (the sandbox has no network, so each would only wait and
        # fail): the update check, analytics, release notes, fetching URLs in the message.
        "--no-check-update",
        "--no-analytics",
        "--no-show-release-notes",
        "--no-detect-urls",
        "--no-show-model-warnings",
        # Plain output for the trace: no colours, no terminal input.
        "--no-pretty",
        "--no-fancy-input",
        "--auto-lint" if knobs["auto_lint"] else "--no-auto-lint",
        "--stream" if knobs["stream"] else "--no-stream",
        "--input-history-file",
        str(STATE / "input.history"),
        "--chat-history-file",
        str(STATE / "chat.history.md"),
        "--encoding",
        "utf-8",
    ]


def exit_status(coder: Coder, errors: list[str]) -> str:
    """How Aider's message ended, in the words of its own state."""
    if coder.num_exhausted_context_windows:
        return "ContextWindowExhausted"  # LiteLLM read the refusal as a context overflow
    if coder.reflected_message and coder.num_reflections >= coder.max_reflections:
        return "ReflectionLimit"  # "Only 3 reflections allowed, stopping."
    if not coder.partial_response_content:
        # A call that failed (the policy server's refusal, say: its error is in `error`), or
        # an empty reply.
        return "CallFailed" if errors else "NoReply"
    return "Replied"


def errors_recorded(coder: Coder) -> list[str]:
    """The errors Aider reports from here on (each still printed as Aider prints it), so that
    the summary can say why a message ended."""
    errors: list[str] = []
    tool_error = coder.io.tool_error

    def record(message: str = "", strip: bool = True) -> None:
        errors.append(str(message))
        tool_error(message, strip)

    coder.io.tool_error = record
    return errors


def main() -> None:
    task = json.loads(Path(os.environ["COEVO_TASK_FILE"]).read_text())
    knobs = json.loads(Path(os.environ["COEVO_KNOBS_FILE"]).read_text())
    workspace = Path(os.environ.get("COEVO_WORKSPACE") or task.get("workspace") or "/app")
    os.chdir(workspace)
    files = workspace_files(workspace, knobs["max_files"])
    # Aider's command line as `aider FILES --message INSTRUCTION` runs it, up to the message:
    # return_coder hands back the coder it built, which then gets the message as `--message`
    # would give it, so that its state (edits, reply, how it ended) can be reported.
    coder = aider_main(aider_argv(knobs, files), return_coder=True)
    if not isinstance(coder, Coder):
        sys.exit(f"aider did not start (it returned {coder!r}); its output says why")
    coder.show_announcements()
    coder.io.tool_output()
    errors = errors_recorded(coder)
    try:
        reply = coder.run(with_message=task["instruction"]) or ""
    except SwitchCoder:
        reply = coder.partial_response_content or ""
    summary = {
        "agent": f"aider {__version__}",
        "exit_status": exit_status(coder, errors),
        "files": len(files),
        "edited": sorted(coder.get_rel_fname(f) for f in coder.aider_edited_files),
        "reply": reply[-2000:],
        "error": errors[-1][-2000:] if errors else "",
    }
    print(json.dumps(summary))  # stdout's tail is kept in the trace
    Path(os.environ["COEVO_ANSWER_FILE"]).write_text(json.dumps(summary))


if __name__ == "__main__":
    main()
