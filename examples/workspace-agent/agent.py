"""A workspace agent on the OpenAI SDK, run as a program.

It edits the files in $COEVO_WORKSPACE (/app) and runs commands through the suite's exec
helper ($COEVO_HELPERS_URL/exec, with $OPENAI_API_KEY as the bearer token), so every command
is in the trace. Two modes (the knob ``mode``):

- "rewrite": one file at a time. The prompt holds the instruction, the visible tests and the
  file; the model answers the file's complete new content in a code block, which is written
  back; the visible tests run and, when they fail, the model tries again with their output.
  Works with a small model (Gemma 3 270M through llama.cpp).
- "tools": function calling with list_files, read_file, write_file and run_command, until the
  model calls no tool or max_turns. Needs a server with tool calling (vLLM with
  --enable-auto-tool-choice, llama.cpp with --jinja, OpenAI-compatible APIs).

Hidden tests judge the workspace when the program exits; nothing needs to be answered.
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from pathlib import Path

from openai import OpenAI

PROMPTS = Path(__file__).resolve().parent / "prompts"
MODEL = "workspace-agent"  # any name: the evaluation's policy answers
TEST_COMMAND = "python -m pytest -q -x -p no:cacheprovider"
SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "node_modules"}
SOURCE_SUFFIXES = {".py", ".sh", ".js", ".ts", ".rb", ".go", ".rs", ".c", ".h", ".java"}
CREATABLE_SUFFIXES = SOURCE_SUFFIXES | {
    ".txt", ".md", ".csv", ".json", ".ini", ".toml", ".yaml", ".yml", ".cfg", ".html", ".xml",
}  # fmt: skip
LANGUAGES = {
    ".py": "python",
    ".sh": "bash",
    ".js": "javascript",
    ".json": "json",
    ".md": "markdown",
}
MENTION = re.compile(
    r"(?<![\w/.-])(?:/app/|\./)?((?:[\w-][\w.-]*/)*[\w-][\w.-]*\.[A-Za-z]\w{0,5})\b"
)
# A fenced block; it ends at a closing fence (``close``) or the end of the reply.
FENCE = re.compile(r"^[ \t]*```[^\n]*\n(?P<body>.*?)(?P<close>^[ \t]*```|\Z)", re.S | re.M)
FEEDBACK_CHARS = 1200  # of a command's output: its end says what failed

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "list_files",
            "description": "List the files in the workspace (/app), one path per line.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the workspace.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "relative to /app"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Replace a file's whole content (or create the file).",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "relative to /app"},
                    "content": {"type": "string", "description": "the complete new content"},
                },
                "required": ["path", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_command",
            "description": "Run a shell command in /app; returns its exit code and output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    },
]


def main() -> None:
    task = json.loads(Path(os.environ["COEVO_TASK_FILE"]).read_text())
    knobs = json.loads(Path(os.environ["COEVO_KNOBS_FILE"]).read_text())
    root = Path(os.environ.get("COEVO_WORKSPACE") or task.get("workspace") or "/app")
    client = OpenAI()
    if knobs["mode"] == "tools":
        summary = with_tools(client, task, knobs, root)
    else:
        summary = rewrite(client, task, knobs, root)
    print(summary)  # stdout's tail is kept in the trace


# --- the exec helper -----------------------------------------------------------------------


def shell(command: str, *, timeout_s: float = 60) -> dict:
    """Run ``command`` in the workspace through the exec helper: traced, one step each."""
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


def command_output(result: dict) -> str:
    output = ((result.get("stdout") or "") + (result.get("stderr") or "")).strip()
    status = "timed out" if result.get("timed_out") else f"exit code {result.get('exit_code')}"
    return f"{status}\n{tail(output, FEEDBACK_CHARS)}"


# --- mode "rewrite" ------------------------------------------------------------------------


def rewrite(client: OpenAI, task: dict, knobs: dict, root: Path) -> str:
    instruction = task["instruction"].strip()
    files = list_files(root)
    target = choose_target(instruction, files, root, how=knobs["edit_target"])
    if target is None:
        return "nothing to edit"
    tests = [f for f in files if is_test(f)]
    feedback = ""
    for attempt in range(1, knobs["max_attempts"] + 1):
        current = read(root / target)
        # A file longer than max_file_chars: its head is shown and rewritten, the rest kept.
        head, rest = split_head(current, knobs["max_file_chars"]) if current else (current, "")
        prompt = build_prompt(instruction, root, target, head, tests, feedback, knobs)
        reply = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompt}],
            temperature=knobs["temperature"] if attempt == 1 else knobs["retry_temperature"],
            max_tokens=token_budget(head, knobs),
        )
        content, closed = extract(reply.choices[0].message.content or "")
        cut = reply.choices[0].finish_reason == "length" and not closed
        problem = rejection(target, content, head, rest, cut=cut)
        if problem:
            feedback = problem
            continue
        write(root / target, content + rest)
        if not tests:
            return f"attempt {attempt}: rewrote {target}; no visible tests"
        result = shell(TEST_COMMAND, timeout_s=60)
        # 5: pytest collected no tests.
        if result["exit_code"] in (0, 5):
            return f"attempt {attempt}: rewrote {target}; the visible tests pass"
        feedback = command_output(result)
    return f"rewrote {target}; the visible tests still fail"


def build_prompt(
    instruction: str,
    root: Path,
    target: str,
    current: str | None,
    tests: list[str],
    feedback: str,
    knobs: dict,
) -> str:
    limit = knobs["max_file_chars"]
    language = LANGUAGES.get(os.path.splitext(target)[1], "")
    shown_tests = ""
    if knobs["show_tests"]:
        for path in relevant_tests(root, target, tests):
            text = read(root / path) or ""
            if len(shown_tests) + len(text) > limit:
                break
            shown_tests += f"\nTests in {path}:\n```python\n{ending(text)}```\n"
    if current is None:
        current_section = f"\n{target} does not exist yet.\n"
    else:
        current_section = f"\nCurrent {target}:\n```{language}\n{ending(current)}```\n"
    feedback_section = ""
    if feedback:
        feedback_section = f"\nThe last version failed:\n```\n{ending(feedback)}```\n"
    template = (PROMPTS / "rewrite.md").read_text()
    return template.format(
        instruction=instruction,
        tests=shown_tests,
        current=current_section,
        feedback=feedback_section,
        path=target,
        language=language,
    )


def token_budget(current: str | None, knobs: dict) -> int:
    """Tokens for one reply: the file (about 3 characters a token for code) and a few words
    around it, so that a model caught in a loop is stopped soon after."""
    if current is None:
        return knobs["max_tokens"]
    return min(knobs["max_tokens"], len(current) // 3 + 192)


def extract(reply: str) -> tuple[str, bool]:
    """(content, closed): the first fenced block of the reply (to the end when it is not
    closed), else the whole reply; closed says whether a closing fence ended it."""
    text = reply.replace("\r\n", "\n")
    match = FENCE.search(text)
    content = match["body"] if match else text
    closed = bool(match and match["close"])
    return (ending(content.strip("\n")) if content.strip() else ""), closed


def rejection(target: str, new: str, old: str | None, rest: str, *, cut: bool) -> str:
    """Why the reply is not written ("" when it is): a cut, unchanged or broken file is never
    better than the one it would replace."""
    if not new.strip():
        return "The reply was empty: write the whole file in one code block."
    if cut:
        return (
            "The reply did not end (it ran past max_tokens, often by repeating itself): "
            "write the file once, then close the code block."
        )
    if old is not None and new.strip() == old.strip():
        return f"That is {target} unchanged: change it as the task says."
    return syntax_error(target, new + rest)


def syntax_error(target: str, content: str) -> str:
    if not target.endswith(".py"):
        return ""
    try:
        compile(content, target, "exec")
    except SyntaxError as exc:
        return f"SyntaxError in {target} line {exc.lineno}: {exc.msg}"
    except ValueError as exc:
        return f"{target} cannot be compiled: {exc}"
    return ""


# --- mode "tools" --------------------------------------------------------------------------


def with_tools(client: OpenAI, task: dict, knobs: dict, root: Path) -> str:
    files = "\n".join(list_files(root))
    messages = [
        {"role": "system", "content": (PROMPTS / "tools.md").read_text()},
        {"role": "user", "content": f"{task['instruction'].strip()}\n\nFiles in /app:\n{files}"},
    ]
    for turn in range(knobs["max_turns"]):
        reply = client.chat.completions.create(
            model=MODEL,
            messages=messages,
            tools=TOOLS,
            temperature=knobs["temperature"],
            max_tokens=knobs["max_tokens"],
        )
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return f"turn {turn + 1}: {message.content or 'done'}"
        for call in message.tool_calls:
            result = run_tool(root, call.function.name, call.function.arguments, knobs)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return f"stopped after max_turns = {knobs['max_turns']}"


def run_tool(root: Path, name: str, arguments: str, knobs: dict) -> str:
    """The tool's result as text; a mistake is an "error: ..." result the model can act on."""
    try:
        args = json.loads(arguments or "{}")
        if not isinstance(args, dict):
            raise ValueError("arguments must be a JSON object")
        if name == "list_files":
            return "\n".join(list_files(root)) or "(no files)"
        if name == "read_file":
            text = read(inside(root, args["path"]))
            if text is None:
                return "error: no such text file"
            return clip(text, knobs["max_file_chars"])
        if name == "write_file":
            path = inside(root, args["path"])
            write(path, str(args["content"]))
            return f"wrote {path.relative_to(root)} ({len(str(args['content']))} characters)"
        if name == "run_command":
            return command_output(shell(str(args["command"]), timeout_s=60))
    except (ValueError, KeyError, TypeError, OSError) as exc:
        return f"error: bad call of {name}: {exc}"
    return f"error: no tool {name!r}; the tools are list_files, read_file, write_file, run_command"


def inside(root: Path, path: str) -> Path:
    """``path`` (relative, or absolute under the workspace) as a path inside the workspace."""
    resolved = (root / path).resolve()
    if not resolved.is_relative_to(root.resolve()):
        raise ValueError(f"{path} is outside {root}")
    return resolved


# --- the workspace -------------------------------------------------------------------------


def list_files(root: Path) -> list[str]:
    found = []
    for directory, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        for name in names:
            if not name.endswith((".pyc", ".pyo")):
                found.append(os.path.relpath(os.path.join(directory, name), root))
    return sorted(found)


def is_test(path: str) -> bool:
    name = os.path.basename(path)
    return (name.startswith("test_") or name.endswith("_test.py")) and name.endswith(".py")


def choose_target(instruction: str, files: list[str], root: Path, *, how: str) -> str | None:
    """As examples/workspace-basic: "named" is the first source file the instruction names or
    a file it asks to create, else the first named file; "largest" (and the fallback) the
    largest non-test source file, else the largest non-test text file."""
    if how == "named":
        named = mentioned(instruction, files)
        for path in named:
            suffix = os.path.splitext(path)[1]
            if suffix in SOURCE_SUFFIXES or (path not in files and suffix in CREATABLE_SUFFIXES):
                return path
        existing = [path for path in named if path in files]
        if existing:
            return existing[0]
    candidates = [f for f in files if not is_test(f) and read(root / f) is not None]
    if not candidates:
        return None
    sources = [f for f in candidates if os.path.splitext(f)[1] in SOURCE_SUFFIXES]
    return max(sources or candidates, key=lambda f: ((root / f).stat().st_size, f))


def mentioned(instruction: str, files: list[str]) -> list[str]:
    by_name: dict[str, list[str]] = {}
    for path in files:
        by_name.setdefault(os.path.basename(path), []).append(path)
    named: list[str] = []
    for match in MENTION.finditer(instruction):
        path = match.group(1)
        if path not in files and len(by_name.get(path, [])) == 1:
            path = by_name[path][0]
        if not is_test(path) and path not in named:
            named.append(path)
    return named


def relevant_tests(root: Path, target: str, tests: list[str]) -> list[str]:
    stem = os.path.splitext(os.path.basename(target))[0]
    return sorted(tests, key=lambda path: stem not in (read(root / path) or ""))


def read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def write(path: Path, content: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)


def split_head(text: str, limit: int) -> tuple[str, str]:
    """(head, rest): ``text`` cut at the last line end within ``limit`` characters."""
    if len(text) <= limit:
        return text, ""
    cut = text.rfind("\n", 0, limit) + 1 or limit
    return text[:cut], text[cut:]


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "\n... (cut)\n"


def tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else "...\n" + text[-limit:]


def ending(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"


if __name__ == "__main__":
    main()
