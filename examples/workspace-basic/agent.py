"""A whole-file rewrite harness for workspace tasks, sized for a small base model.

run(task, ctx) picks one file to change (the one the instruction names, or the largest source
file), shows the model the instruction, that file and (knob show_tests) the visible tests, and
asks for the file's complete new content after an opened code fence: a small model copies and
edits a whole file far more reliably than it writes a diff. A reply that is cut off, unchanged
or not valid Python is not written; otherwise it replaces the file, the visible tests run
through ctx.shell (so they are in the trace) and, when they fail, the model tries again with
the failure output in the prompt, up to max_attempts times. Hidden tests judge /app
afterwards; the return value is only a note for the trace.
"""

import os
import re
from pathlib import Path

PROMPT = (Path(__file__).resolve().parent / "prompts" / "rewrite.txt").read_text()
TEST_COMMAND = "python -m pytest -q -x -p no:cacheprovider"
SKIP_DIRS = {".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "node_modules"}
SOURCE_SUFFIXES = {".py", ".sh", ".js", ".ts", ".rb", ".go", ".rs", ".c", ".h", ".java"}
# Suffixes of files an instruction may ask to create (a name it mentions that does not exist).
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
# A file name in the instruction: "/app/greet.py", `inventory/report.py`, hello.txt.
MENTION = re.compile(
    r"(?<![\w/.-])(?:/app/|\./)?((?:[\w-][\w.-]*/)*[\w-][\w.-]*\.[A-Za-z]\w{0,5})\b"
)
# A fenced block the model opened itself; it ends at a closing fence or the end of the reply.
FENCE = re.compile(r"^[ \t]*```[^\n]*\n(.*?)(?:^[ \t]*```|\Z)", re.S | re.M)
CLOSING_FENCE = re.compile(r"^[ \t]*```", re.M)
FEEDBACK_CHARS = 1200  # of the test output: the end says what failed


def run(task, ctx):
    knobs = ctx.knobs
    root = Path(task.get("workspace") or ctx.workspace or "/app")
    instruction = task["instruction"].strip()
    files = list_files(root)
    target = choose_target(instruction, files, root, how=knobs["edit_target"])
    if target is None:
        ctx.log("no file to edit: the workspace holds no text file and the instruction names none")
        return "nothing to edit"
    tests = [f for f in files if is_test(f)]
    ctx.log(f"editing {target}", files=files[:50], tests=tests)
    feedback = ""
    for attempt in range(1, knobs["max_attempts"] + 1):
        current = read(root / target)
        # A file longer than max_file_chars: its head is shown and rewritten, the rest kept.
        head, rest = split_head(current, knobs["max_file_chars"]) if current else (current, "")
        prompt = build_prompt(instruction, root, target, head, tests, feedback, knobs)
        reply = ctx.llm.complete(
            prompt,
            max_tokens=token_budget(head, knobs),
            temperature=knobs["temperature"] if attempt == 1 else knobs["retry_temperature"],
            stop=["\n```"],
        )
        content = extract(reply.text, opened=True)
        cut = reply.finish_reasons[:1] == ["length"]
        problem = rejection(target, content, head, rest, cut=cut)
        if problem:
            feedback = problem
            ctx.log(f"attempt {attempt}: not written: {problem}")
            continue
        content += rest
        write(root / target, content)
        if not tests:
            ctx.log(f"attempt {attempt}: wrote {target} ({len(content)} chars); no visible tests")
            return f"rewrote {target}"
        result = ctx.shell(TEST_COMMAND, timeout_s=60)
        output = (result["stdout"] + result["stderr"]).strip()
        # 5: pytest collected no tests (none that it can find counts as nothing to fail).
        if result["exit_code"] in (0, 5):
            ctx.log(f"attempt {attempt}: the visible tests pass")
            return f"rewrote {target}; visible tests pass"
        feedback = tail(output, FEEDBACK_CHARS)
        if result["timed_out"]:
            feedback = "The tests timed out (an endless loop?).\n" + feedback
        ctx.log(f"attempt {attempt}: the visible tests fail", exit_code=result["exit_code"])
    return f"rewrote {target}; visible tests still fail"


# --- the workspace -------------------------------------------------------------------------


def list_files(root):
    """Paths relative to ``root``, sorted, without caches and version-control directories."""
    found = []
    for directory, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info"))
        for name in names:
            if not name.endswith((".pyc", ".pyo")):
                found.append(os.path.relpath(os.path.join(directory, name), root))
    return sorted(found)


def is_test(path):
    name = os.path.basename(path)
    return (name.startswith("test_") or name.endswith("_test.py")) and name.endswith(".py")


def choose_target(instruction, files, root, *, how):
    """The file to rewrite. "named": the first file the instruction names that is source code
    or does not exist yet (a file to create), else the first named file, else as "largest";
    "largest": the largest non-test source file, else the largest non-test text file."""
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


def mentioned(instruction, files):
    """Non-test file names in the instruction, in order of first mention; a bare name that
    matches one file in a subdirectory ("report.py") stands for it."""
    by_name = {}
    for path in files:
        by_name.setdefault(os.path.basename(path), []).append(path)
    named = []
    for match in MENTION.finditer(instruction):
        path = match.group(1)
        if path not in files and len(by_name.get(path, [])) == 1:
            path = by_name[path][0]
        if not is_test(path) and path not in named:
            named.append(path)
    return named


def read(path):
    """The text of ``path``, or None when it is missing or not text."""
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def write(path, content):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)


# --- the prompt and the reply --------------------------------------------------------------


def build_prompt(instruction, root, target, current, tests, feedback, knobs):
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
    return PROMPT.format(
        instruction=instruction,
        tests=shown_tests,
        current=current_section,
        feedback=feedback_section,
        path=target,
        language=language,
    )


def token_budget(current, knobs):
    """Tokens for one reply: a rewrite is about as long as the file (code runs at about 3
    characters a token), so a model caught in a loop is stopped soon after it."""
    if current is None:
        return knobs["max_tokens"]
    return min(knobs["max_tokens"], len(current) // 3 + 128)


def relevant_tests(root, target, tests):
    """Visible tests that mention the target's module first (they say what it must do)."""
    stem = os.path.splitext(os.path.basename(target))[0]
    return sorted(tests, key=lambda path: stem not in (read(root / path) or ""))


def extract(reply, *, opened):
    """The file's content in the reply: with the fence already opened by the prompt, the text
    up to the closing fence, unless the model opened a block of its own; otherwise the first
    fenced block, or else the whole reply."""
    text = reply.replace("\r\n", "\n")
    if opened and not text.lstrip().startswith("```"):
        content = CLOSING_FENCE.split(text, maxsplit=1)[0]
    else:
        match = FENCE.search(text)
        content = match.group(1) if match else text
    return ending(content.strip("\n")) if content.strip() else ""


def rejection(target, new, old, rest, *, cut):
    """Why the reply is not written ("" when it is): a cut, unchanged or broken file is never
    better than the one it would replace."""
    if not new.strip():
        return "The reply was empty: write the whole file."
    if cut:
        return (
            "The reply did not end (it ran past max_tokens, often by repeating itself): "
            "write the file once, then close the code block."
        )
    if old is not None and new.strip() == old.strip():
        return f"That is {target} unchanged: change it as the task says."
    return syntax_error(target, new + rest)


def syntax_error(target, content):
    """Why ``content`` is not valid Python ("" when it is, or when ``target`` is not Python)."""
    if not target.endswith(".py"):
        return ""
    try:
        compile(content, target, "exec")
    except SyntaxError as exc:
        return f"SyntaxError in {target} line {exc.lineno}: {exc.msg}"
    except ValueError as exc:
        return f"{target} cannot be compiled: {exc}"
    return ""


def split_head(text, limit):
    """(head, rest): ``text`` cut at the last line end within ``limit`` characters."""
    if len(text) <= limit:
        return text, ""
    cut = text.rfind("\n", 0, limit) + 1 or limit
    return text[:cut], text[cut:]


def tail(text, limit):
    return text if len(text) <= limit else "...\n" + text[-limit:]


def ending(text):
    return text if text.endswith("\n") else text + "\n"
