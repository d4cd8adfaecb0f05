"""An OpenAI-SDK agent with two tools, as a team would write it for the OpenAI API.

Nothing here knows coevo but three environment variables: the task comes from
$COEVO_TASK_FILE, the knobs from $COEVO_KNOBS_FILE, and the answer goes to $COEVO_ANSWER_FILE.
The OpenAI client finds its endpoint and key in OPENAI_BASE_URL and OPENAI_API_KEY, as it
would anywhere.
"""

from __future__ import annotations

import ast
import json
import operator
import os
import re
from pathlib import Path

from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculate",
            "description": "Evaluate an arithmetic expression (+ - * / ** and parentheses).",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "convert",
            "description": "Convert a quantity between units of length, mass or time.",
            "parameters": {
                "type": "object",
                "properties": {
                    "value": {"type": "number"},
                    "from_unit": {"type": "string"},
                    "to_unit": {"type": "string"},
                },
                "required": ["value", "from_unit", "to_unit"],
            },
        },
    },
]

# Each unit in its dimension's base unit (metres, kilograms, seconds).
DIMENSIONS = {
    "length": {
        "mm": 0.001,
        "cm": 0.01,
        "m": 1.0,
        "km": 1000.0,
        "in": 0.0254,
        "ft": 0.3048,
        "yd": 0.9144,
        "mi": 1609.344,
    },
    "mass": {"g": 0.001, "kg": 1.0, "lb": 0.45359237, "oz": 0.028349523125},
    "time": {"s": 1.0, "min": 60.0, "h": 3600.0, "day": 86400.0},
}
UNITS = {unit: size for units in DIMENSIONS.values() for unit, size in units.items()}
DIMENSION = {unit: name for name, units in DIMENSIONS.items() for unit in units}
OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
}


def calculate(expression: str) -> str:
    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.operand))
        raise ValueError(f"not arithmetic: {ast.dump(node)[:60]}")

    try:
        return repr(value(ast.parse(expression, mode="eval").body))
    except (ValueError, SyntaxError, ZeroDivisionError, OverflowError) as exc:
        return f"error: {exc}"


def convert(value: float, from_unit: str, to_unit: str) -> str:
    if from_unit not in UNITS or to_unit not in UNITS:
        return f"error: known units are {', '.join(UNITS)}"
    if DIMENSION[from_unit] != DIMENSION[to_unit]:
        return f"error: cannot convert {DIMENSION[from_unit]} to {DIMENSION[to_unit]}"
    return repr(value * UNITS[from_unit] / UNITS[to_unit])


def run_tool(name: str, arguments: str) -> str:
    try:
        args = json.loads(arguments or "{}")
        if name == "calculate":
            return calculate(str(args["expression"]))
        if name == "convert":
            return convert(float(args["value"]), str(args["from_unit"]), str(args["to_unit"]))
    except (ValueError, KeyError, TypeError) as exc:
        return f"error: bad arguments for {name}: {exc}"
    return f"error: no tool {name!r}"


def last_number(text: str) -> float | None:
    numbers = re.findall(r"-?\d+(?:\.\d+)?(?:e-?\d+)?", text or "")
    return float(numbers[-1]) if numbers else None


def main() -> None:
    task = json.loads(Path(os.environ["COEVO_TASK_FILE"]).read_text())
    knobs = json.loads(Path(os.environ["COEVO_KNOBS_FILE"]).read_text())
    system = (Path(__file__).parent / "prompts" / "system.md").read_text()
    client = OpenAI()
    messages = [{"role": "system", "content": system}, {"role": "user", "content": task["input"]}]
    answer: float | None = None
    for turn in range(knobs["max_turns"]):
        reply = client.chat.completions.create(
            model="gpt-4o-mini",  # any name: the evaluation's policy answers
            messages=messages,
            tools=TOOLS,
            tool_choice=knobs["tool_choice"] if turn == 0 else "auto",
            temperature=knobs["temperature"],
            max_tokens=256,
        )
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            said = last_number(message.content or "")
            answer = said if said is not None else answer  # else the last tool result stands
            break
        for call in message.tool_calls:
            result = run_tool(call.function.name, call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
            number = last_number(result) if not result.startswith("error") else None
            answer = number if number is not None else answer
    Path(os.environ["COEVO_ANSWER_FILE"]).write_text(json.dumps(answer))


if __name__ == "__main__":
    main()
