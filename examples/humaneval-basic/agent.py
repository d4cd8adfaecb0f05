"""A plain completion harness for HumanEval.

run(task, ctx) receives the task's prompt (a function signature and docstring) and returns
the function body the model writes. With samples > 1 it draws several completions and keeps
the one that passes most of the examples shown in the docstring (never the hidden tests,
which this code cannot see), evaluated here or, with the knob check_with_worker, by the
worker's ctx.check helper.
"""

import re
import subprocess
import sys

STOPS = {
    "function": ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\n```", "\nassert "],
    "none": [],
}
EXAMPLE = re.compile(
    r"^\s*>>>\s*(?P<expr>.+?)\s*\n\s*(?P<expected>[^\n>][^\n]*?)\s*$", re.MULTILINE
)


CHECK = """
try:
    _got = repr(eval({expr!r}))
    try:
        _ok += _got == {expected!r} or _got == repr(eval({expected!r}))
    except Exception:
        _ok += _got == {expected!r}
except Exception:
    pass
"""


def run(task, ctx):
    knobs = ctx.knobs
    samples = knobs["samples"]
    temperature = knobs["temperature"] if samples == 1 else knobs["sample_temperature"]
    result = ctx.llm.complete(
        task["prompt"],
        max_tokens=knobs["max_tokens"],
        temperature=temperature,
        stop=STOPS[knobs["stop_style"]],
        n=samples,
    )
    completions = [trim(text) for text in result.texts]
    if len(completions) == 1:
        return completions[0]
    if knobs["check_with_worker"] and "check" in ctx.helpers:
        return best_by_worker_check(completions, ctx)
    examples = visible_examples(task["prompt"])
    if not examples:
        ctx.log("no >>> examples in the prompt; keeping the first sample")
        return completions[0]
    scored = [
        (passed_examples(task["prompt"], c, examples), -i, c) for i, c in enumerate(completions)
    ]
    best = max(scored)
    ctx.log(f"examples passed per sample: {[s[0] for s in scored]} of {len(examples)}")
    return best[2]


def best_by_worker_check(completions, ctx):
    """The first sample that passes the prompt's examples by ctx.check, else the one that
    fails the fewest of them."""
    results = [ctx.check(c) for c in completions]
    ctx.log(f"ctx.check per sample: {[(r['passed'], r['failed']) for r in results]}")

    def rank(i):
        failed = results[i]["failed"]
        return (results[i]["passed"], -(failed if failed is not None else 10**6), -i)

    return completions[max(range(len(completions)), key=rank)]


def trim(text):
    """Keep the indented body: stop at the first non-empty line that starts at column 0."""
    lines = text.split("\n")
    kept = []
    for i, line in enumerate(lines):
        if i > 0 and line.strip() and not line[0].isspace():
            break
        kept.append(line)
    return "\n".join(kept).rstrip() + "\n"


def visible_examples(prompt):
    return [(m["expr"], m["expected"]) for m in EXAMPLE.finditer(prompt)]


def passed_examples(prompt, completion, examples):
    checks = "\n".join(CHECK.format(expr=expr, expected=expected) for expr, expected in examples)
    program = f"{prompt}{completion}\n_ok = 0\n{checks}\nprint(_ok)\n"
    try:
        out = subprocess.run(
            [sys.executable, "-c", program], capture_output=True, text=True, timeout=5
        )
        return int(out.stdout.strip().splitlines()[-1])
    except Exception:
        return 0
