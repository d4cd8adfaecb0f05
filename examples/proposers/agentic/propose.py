"""An agentic proposer (Meta-Harness) on the OpenAI SDK, run as a program.

It improves another harness. /app ($COEVO_WORKSPACE) is a writable copy of the parent
candidate's tree and /history the campaign's record, read-only (record.md, shown.json,
candidates/<sha>/); what the program leaves in /app is the proposal, and the one-line
hypothesis it writes to $COEVO_ANSWER_FILE becomes the proposal's message. Two modes (the knob
``mode``):

- "tools": a read-search-edit loop with function calling (list_dir, read_file, grep,
  write_file, replace_in_file, run_command, finish) until the model calls finish or max_turns.
  Meta-Harness's finding is that a proposer does best when it browses the raw record (code,
  scores, failing traces) itself rather than reading a summary, so the record is handed over
  as files, not condensed into the prompt.
- "oneshot": one call for a small model without tool calling. The prompt holds the head of
  record.md and the smallest component files; the answer's SEARCH/REPLACE blocks that match
  exactly once are applied.

Edits are refused before they reach the disk when they fall outside the declared components,
change harness.toml's [harness] contract, or leave a Python file that does not compile: the
campaign would reject such a proposal, and the model can still correct itself.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib
import urllib.request
from pathlib import Path, PurePosixPath

from openai import BadRequestError, OpenAI

PROMPTS = Path(__file__).resolve().parent / "prompts"
MODEL = "agentic-proposer"  # any name: the campaign's proposer endpoint answers
MANIFEST = "harness.toml"
# The [harness] keys a proposal may not change (the campaign's manifest stage refuses them).
CONTRACT_KEYS = ("components", "entrypoint", "command")
SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "node_modules"}
MAX_HYPOTHESIS_CHARS = 500
MAX_LISTED = 200  # entries of one list_dir
GREP_TIMEOUT_S = 30
COMMAND_TIMEOUT_S = 60
HYPOTHESIS = re.compile(r"^\s*\**HYPOTHESIS\**\s*:\s*(?P<text>.*)$", re.I | re.M)
FENCE_LINE = re.compile(r"^\s*```[\w+-]*\s*$")
BLOCK = re.compile(
    r"^<{7} SEARCH[ \t]+(?P<path>\S[^\n]*?)[ \t]*\n(?P<search>.*?)^={7}[ \t]*\n"
    r"(?P<replace>.*?)^>{7} REPLACE[ \t]*$",
    re.S | re.M,
)

NUDGE = (
    "Continue with the tools. When your edit is made, call finish with the hypothesis in one line."
)


def _function(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


PATH = {"type": "string", "description": "under /app or /history; a relative path is in /app"}
TOOLS = [
    _function(
        "list_dir",
        "List a directory of /app or /history: subdirectories end with '/', files show their size.",
        {"path": PATH},
        ["path"],
    ),
    _function(
        "read_file",
        "Read a text file of /app or /history, or some of its lines (1-based, inclusive).",
        {
            "path": PATH,
            "start_line": {"type": "integer", "description": "first line (default 1)"},
            "end_line": {"type": "integer", "description": "last line (default: the end)"},
        },
        ["path"],
    ),
    _function(
        "grep",
        "Search files for an extended regular expression (grep -rnE): matching lines with "
        "their file and line number.",
        {"pattern": {"type": "string"}, "path": PATH},
        ["pattern", "path"],
    ),
    _function(
        "write_file",
        "Replace a file's whole content, or create it. Only files of the editable components "
        "in /app.",
        {
            "path": {"type": "string", "description": "relative to /app"},
            "content": {"type": "string", "description": "the complete new content"},
        },
        ["path", "content"],
    ),
    _function(
        "replace_in_file",
        "Replace a text that occurs exactly once in a file of the editable components in /app.",
        {
            "path": {"type": "string", "description": "relative to /app"},
            "search": {"type": "string", "description": "copied exactly from the file"},
            "replace": {"type": "string", "description": "what it becomes"},
        },
        ["path", "search", "replace"],
    ),
    _function(
        "run_command",
        "Run a shell command in /app (its own sandbox: /history is not there); returns the "
        "exit code and output.",
        {"command": {"type": "string"}},
        ["command"],
    ),
    _function(
        "finish",
        "End with the hypothesis your edit tests, in one line: what you changed and why it "
        "should help.",
        {"hypothesis": {"type": "string"}},
        ["hypothesis"],
    ),
]
TOOL_NAMES = ", ".join(tool["function"]["name"] for tool in TOOLS)


class ToolError(Exception):
    """A call the model got wrong: its message goes back to the model as the tool's result."""


def main() -> None:
    task = json.loads(Path(os.environ["COEVO_TASK_FILE"]).read_text())
    knobs = json.loads(Path(os.environ["COEVO_KNOBS_FILE"]).read_text())
    proposer = Proposer(
        root=Path(os.environ.get("COEVO_WORKSPACE") or task.get("workspace") or "/app"),
        history=Path(task.get("history") or "/history"),
        components=[str(c) for c in task.get("components") or []],
        knobs=knobs,
    )
    client = OpenAI()
    if knobs["mode"] == "oneshot":
        hypothesis, summary = proposer.oneshot(client, task["instruction"])
    else:
        hypothesis, summary = proposer.with_tools(client, task["instruction"])
    if hypothesis:
        Path(os.environ["COEVO_ANSWER_FILE"]).write_text(
            json.dumps(hypothesis[:MAX_HYPOTHESIS_CHARS])
        )
    changed = proposer.changed()
    print(f"{summary}; changed: {', '.join(changed) or 'nothing'}")  # kept in the trace


class Proposer:
    def __init__(self, *, root: Path, history: Path, components: list[str], knobs: dict):
        self.root = root.resolve()
        self.history = history.resolve()
        self.components = components
        self.knobs = knobs
        self.start = snapshot(self.root)

    def changed(self) -> list[str]:
        now = snapshot(self.root)
        return sorted(p for p in set(now) | set(self.start) if now.get(p) != self.start.get(p))

    # --- mode "tools" ----------------------------------------------------------------------

    def with_tools(self, client: OpenAI, instruction: str) -> tuple[str, str]:
        messages = [
            {"role": "system", "content": (PROMPTS / "tools.md").read_text()},
            {"role": "user", "content": self.first_message(instruction)},
        ]
        for turn in range(1, self.knobs["max_turns"] + 1):
            try:
                reply = client.chat.completions.create(
                    model=MODEL,
                    messages=messages,
                    tools=TOOLS,
                    temperature=self.knobs["temperature"],
                    max_tokens=self.knobs["max_tokens"],
                )
            except BadRequestError as exc:
                # The server refused (a context window outgrown, say): the edits so far stand.
                return "", f"turn {turn}: the model's server refused the request: {exc}"
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                if self.changed() and (message.content or "").strip():
                    # A model that ends in prose after its edit: its first line is the hypothesis.
                    return first_line(message.content or ""), f"turn {turn}: ended without finish"
                messages.append({"role": "user", "content": NUDGE})
                continue
            hypothesis = ""
            for call in message.tool_calls:
                try:
                    result = self.run_tool(call.function.name, call.function.arguments)
                except Finished as done:
                    hypothesis, result = done.hypothesis, "finished"
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            if hypothesis:
                return hypothesis, f"turn {turn}: finished"
        return "", f"stopped after max_turns = {self.knobs['max_turns']}"

    def first_message(self, instruction: str) -> str:
        files = "\n".join(sorted(snapshot(self.root)))
        parts = [
            instruction.strip(),
            f"Editable components: {', '.join(self.components) or 'none'}",
            f"Files in /app:\n{files}",
        ]
        if self.history.is_dir():
            parts.append(f"In {self.history}:\n{self.list_dir(str(self.history))}")
        record = read_text(self.history / "record.md")
        limit = self.knobs["record_chars"]
        if record and limit:
            head = clip(record, limit, what="record.md", lines=True)
            parts.append(f"The head of {self.history}/record.md:\n{head}")
        return "\n\n".join(parts)

    def run_tool(self, name: str, arguments: str) -> str:
        """The tool's result as text; a mistake is an "error: ..." result the model can act on.
        Raises Finished for finish."""
        try:
            args = json.loads(arguments or "{}")
            if not isinstance(args, dict):
                raise ToolError("the arguments must be a JSON object")
            if name == "list_dir":
                return self.list_dir(str(args.get("path") or "."))
            if name == "read_file":
                return self.read_file(args["path"], args.get("start_line"), args.get("end_line"))
            if name == "grep":
                return self.grep(str(args["pattern"]), str(args.get("path") or "."))
            if name == "write_file":
                return self.write_file(args["path"], str(args["content"]))
            if name == "replace_in_file":
                return self.replace_in_file(args["path"], str(args["search"]), args["replace"])
            if name == "run_command":
                return self.run_command(str(args["command"]))
            if name == "finish":
                return self.finish(str(args.get("hypothesis") or ""))
        except ToolError as exc:
            return f"error: {exc}"
        except KeyError as exc:
            return f"error: {name} needs the argument {exc}"
        except (ValueError, TypeError, OSError) as exc:
            return f"error: bad call of {name}: {exc}"
        return f"error: no tool {name!r}; the tools are {TOOL_NAMES}"

    def list_dir(self, path: str) -> str:
        directory = self.readable(path)
        if not directory.is_dir():
            raise ToolError(f"{path} is not a directory")
        rows = []
        for entry in sorted(directory.iterdir(), key=lambda e: e.name):
            if entry.name in SKIP_DIRS:
                continue
            if entry.is_symlink():
                rows.append(f"{entry.name} (a link)")
            elif entry.is_dir():
                rows.append(f"{entry.name}/")
            else:
                rows.append(f"{entry.name} ({entry.stat().st_size} bytes)")
        shown = rows[:MAX_LISTED]
        if len(rows) > MAX_LISTED:
            shown.append(f"... and {len(rows) - MAX_LISTED} more")
        return "\n".join(shown) or "(empty)"

    def read_file(self, path: str, start_line: object = None, end_line: object = None) -> str:
        target = self.readable(path)
        text = read_text(target)
        if text is None:
            raise ToolError(f"{path} is not a text file")
        lines = text.splitlines(keepends=True)
        start = max(1, int(start_line or 1))
        end = min(len(lines), int(end_line or len(lines)))
        if start > max(1, len(lines)):
            raise ToolError(f"{path} has {len(lines)} lines")
        body = "".join(lines[start - 1 : end])
        limit = self.knobs["result_chars"]
        header = f"{target}: lines {start}-{end} of {len(lines)}\n"
        if len(body) <= limit:
            return header + body
        cut = body.rfind("\n", 0, limit) + 1 or limit
        next_line = start + body[:cut].count("\n")
        return (
            header
            + body[:cut]
            + f"\n... (cut at {limit} characters: read on with start_line={next_line})\n"
        )

    def grep(self, pattern: str, path: str) -> str:
        target = self.readable(path)
        argv = ["grep", "-rnIE", "--exclude-dir=.git", "-e", pattern, "--", str(target)]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=GREP_TIMEOUT_S)
        except FileNotFoundError:
            return self.clip_result(python_grep(pattern, target), "grep's output")
        except subprocess.TimeoutExpired:
            raise ToolError(f"grep took over {GREP_TIMEOUT_S} s: narrow the path") from None
        if done.returncode == 1:
            return "no match"
        if done.returncode != 0:
            raise ToolError(done.stderr.strip() or f"grep exited with {done.returncode}")
        return self.clip_result(done.stdout, "grep's output")

    def write_file(self, path: str, content: str) -> str:
        target, relative = self.editable(path)
        self.save(target, relative, content)
        return f"wrote {relative} ({len(content)} characters)"

    def replace_in_file(self, path: str, search: str, replace: object) -> str:
        target, relative = self.editable(path)
        text = read_text(target)
        if text is None:
            raise ToolError(f"{relative} does not exist (write_file creates a file)")
        if not search:
            raise ToolError("the search text is empty: copy the lines to replace from the file")
        count = text.count(search)
        if count != 1:
            how = "does not occur" if not count else f"occurs {count} times"
            raise ToolError(
                f"the search text {how} in {relative}; it must occur exactly once: copy it "
                "exactly from the file (read_file), with enough lines to be unique"
            )
        self.save(target, relative, text.replace(search, str(replace), 1))
        return f"replaced 1 occurrence in {relative}"

    def run_command(self, command: str) -> str:
        if "exec" not in os.environ.get("COEVO_HELPERS", "").split(","):
            raise ToolError("no command runner here (the exec helper is not offered)")
        result = shell(command, timeout_s=COMMAND_TIMEOUT_S)
        output = ((result.get("stdout") or "") + (result.get("stderr") or "")).strip()
        status = "timed out" if result.get("timed_out") else f"exit code {result.get('exit_code')}"
        limit = self.knobs["result_chars"]
        tail = output if len(output) <= limit else "...\n" + output[-limit:]
        return f"{status}\n{tail}"

    def finish(self, hypothesis: str) -> str:
        if not hypothesis.strip():
            raise ToolError("finish needs the hypothesis: one line, what you changed and why")
        if not self.changed():
            raise ToolError(
                "no file in /app differs from the parent yet: make the edit first "
                "(replace_in_file or write_file), then call finish"
            )
        raise Finished(first_line(hypothesis))

    def clip_result(self, text: str, what: str) -> str:
        return clip(text, self.knobs["result_chars"], what=what) or "(nothing)"

    # --- paths -----------------------------------------------------------------------------

    def readable(self, path: str) -> Path:
        """``path`` (absolute, or relative to /app) when it is in /app or /history."""
        target = (self.root / str(path)).resolve()
        if target.is_relative_to(self.root) or target.is_relative_to(self.history):
            if not target.exists():
                raise ToolError(f"{path} does not exist")
            return target
        raise ToolError(f"{path} is outside /app and {self.history}")

    def editable(self, path: str) -> tuple[Path, str]:
        """(the file, its path relative to /app) when it is in an editable component."""
        target = (self.root / str(path)).resolve()
        if not target.is_relative_to(self.root):
            raise ToolError(
                f"{path} is not in the workspace /app: only the harness's editable components "
                f"there may change ({', '.join(self.components) or 'none'})"
            )
        relative = target.relative_to(self.root).as_posix()
        problem = component_problem(relative, self.components)
        if problem:
            raise ToolError(problem)
        if target.is_dir():
            raise ToolError(f"{relative} is a directory")
        return target, relative

    def save(self, target: Path, relative: str, content: str) -> None:
        problem = content_problem(relative, content, self.start.get(relative))
        if problem:
            raise ToolError(f"{problem}; nothing was written")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)

    # --- mode "oneshot" --------------------------------------------------------------------

    def oneshot(self, client: OpenAI, instruction: str) -> tuple[str, str]:
        prompt = (
            (PROMPTS / "oneshot.md")
            .read_text()
            .format(
                instruction=instruction.strip(),
                components=", ".join(self.components) or "none",
                files=self.component_files(),
                record=clip(
                    read_text(self.history / "record.md") or "(none)\n",
                    self.knobs["record_chars"],
                    what="record.md",
                    lines=True,
                ),
            )
        )
        sampling = {
            "temperature": self.knobs["temperature"],
            "max_tokens": self.knobs["max_tokens"],
        }
        try:
            if self.knobs["api"] == "completions":
                # The prompt ends where the answer starts, so a base model continues it.
                prompt += "\nHYPOTHESIS:"
                reply = client.completions.create(model=MODEL, prompt=prompt, **sampling)
                answer = "HYPOTHESIS:" + (reply.choices[0].text or "")
            else:
                reply = client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": prompt}], **sampling
                )
                answer = reply.choices[0].message.content or ""
        except BadRequestError as exc:
            return "", f"the model's server refused the request: {exc}"
        print(answer)  # the raw answer, in the trace beside the call
        hypothesis, edits = parse_answer(answer)
        applied, skipped = self.apply(edits)
        for reason in skipped:
            print(f"skipped: {reason}")
        summary = f"applied {len(applied)} of {len(edits)} blocks"
        return (hypothesis if applied else ""), summary

    def component_files(self) -> str:
        """The component files, smallest first while they fit in file_chars: a small model
        can edit a short file (a manifest's knob defaults, a prompt) more safely than a long
        one, and the record says what matters."""
        budget = self.knobs["file_chars"]
        shown, named = [], []
        for relative, data in sorted(self.start.items(), key=lambda item: (len(item[1]), item[0])):
            if component_problem(relative, self.components):
                continue
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                continue
            if len(text) > budget:
                named.append(f"{relative} ({len(text)} characters, not shown)")
                continue
            budget -= len(text)
            shown.append(f"--- {relative}\n{ending(text)}")
        return "".join(shown) + "".join(f"--- {line}\n" for line in named)

    def apply(self, edits: list[tuple[str, str, str]]) -> tuple[list[str], list[str]]:
        """Apply the blocks in order, each to the text the earlier ones left; a block that is
        outside the components, matches zero or several times, or breaks the file is skipped."""
        current: dict[str, str] = {}
        applied, skipped = [], []
        for path, search, replace in edits:
            try:
                target, relative = self.editable(path)
            except ToolError as exc:
                skipped.append(str(exc))
                continue
            text = current.get(relative, read_text(target))
            if not search:
                if text is not None:
                    skipped.append(f"{relative}: an empty SEARCH creates a file, and it exists")
                    continue
                new = replace
            elif text is None or text.count(search) != 1:
                count = 0 if text is None else text.count(search)
                skipped.append(f"{relative}: the SEARCH text occurs {count} times, not once")
                continue
            else:
                new = text.replace(search, replace, 1)
            problem = content_problem(relative, new, self.start.get(relative))
            if problem:
                skipped.append(problem)
                continue
            current[relative] = new
            applied.append(relative)
        for relative, text in current.items():
            target = self.root / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        return applied, skipped


class Finished(Exception):
    def __init__(self, hypothesis: str) -> None:
        super().__init__(hypothesis)
        self.hypothesis = hypothesis


# --- edits -------------------------------------------------------------------------------------


def component_problem(relative: str, components: list[str]) -> str:
    """Why ``relative`` may not be edited ("" when it may): as the campaign's own check, a
    file component matches itself and a directory component (ending in '/') what is under it."""
    pure = PurePosixPath(relative)
    if pure.parts and pure.parts[0] == ".git":
        return f"{relative} is in .git"
    for component in components:
        if component.endswith("/"):
            if relative.startswith(component):
                return ""
        elif relative == str(PurePosixPath(component)):
            return ""
    return (
        f"{relative} is outside the declared components "
        f"({', '.join(components) or 'none'}): edits there are refused"
    )


def content_problem(relative: str, new: str, old: bytes | None) -> str:
    """Why ``new`` would make the proposal invalid ("" when it would not)."""
    if relative.endswith(".py"):
        try:
            compile(new, relative, "exec")
        except SyntaxError as exc:
            return f"{relative} would not compile: SyntaxError line {exc.lineno}: {exc.msg}"
        except ValueError as exc:
            return f"{relative} would not compile: {exc}"
    if relative == MANIFEST:
        try:
            after = tomllib.loads(new).get("harness", {})
            before = tomllib.loads(old.decode()).get("harness", {}) if old else {}
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            return f"{MANIFEST} would not parse: {exc}"
        for key in CONTRACT_KEYS:
            if before.get(key) != after.get(key):
                return f"{MANIFEST}'s [harness] {key} may not change (it is the contract)"
    return ""


def parse_answer(answer: str) -> tuple[str, list[tuple[str, str, str]]]:
    """(hypothesis, [(path, search, replace)]) of a oneshot answer; code fences are ignored."""
    text = answer.replace("\r\n", "\n")
    match = HYPOTHESIS.search(text)
    hypothesis = match["text"].strip() if match else ""
    text = "\n".join(line for line in text.split("\n") if not FENCE_LINE.match(line))
    edits = [(m["path"].strip(), m["search"], m["replace"]) for m in BLOCK.finditer(text + "\n")]
    return hypothesis, edits


# --- the exec helper ---------------------------------------------------------------------------


def shell(command: str, *, timeout_s: float) -> dict:
    """Run ``command`` in /app through the exec helper: its own sandbox, in the trace."""
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


# --- files -------------------------------------------------------------------------------------


def snapshot(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` (links are not followed): what /app held at start."""
    found = {}
    for directory, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS)
        for name in names:
            path = Path(directory, name)
            if path.is_file() and not path.is_symlink() and not name.endswith((".pyc", ".pyo")):
                found[path.relative_to(root).as_posix()] = path.read_bytes()
    return found


def python_grep(pattern: str, target: Path) -> str:
    """grep -rnE without grep (a sandbox image may lack it)."""
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise ToolError(f"bad pattern: {exc}") from None
    files = [target] if target.is_file() else sorted(p for p in target.rglob("*") if p.is_file())
    rows = []
    for path in files:
        for number, line in enumerate((read_text(path) or "").splitlines(), 1):
            if regex.search(line):
                rows.append(f"{path}:{number}:{line}")
    return "\n".join(rows) or "no match"


def read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def clip(text: str, limit: int, *, what: str, lines: bool = False) -> str:
    if len(text) <= limit:
        return text
    cut = (text.rfind("\n", 0, limit) + 1 or limit) if lines else limit
    return text[:cut] + f"\n... ({what} cut at {cut} of {len(text)} characters)\n"


def first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def ending(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"


if __name__ == "__main__":
    main()
