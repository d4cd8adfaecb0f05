"""A prompt-and-parse agent for TextWorld games on a base model.

Every step it shows the model the goal, the last ``history`` steps and the current
observation. With the admissible commands listed (``list_commands``) the model answers a
number and the agent plays that command; an answer that names no listed number falls back to
the first listed command. Without the list, the model's first line is the command.

A small model mostly answers "1", so the order of the list is most of the policy: with
``order = "priority"`` commands not played yet come first, then those naming more of the
goal's words (the recipe's, once the cookbook is read), then by kind of command.
"""

import re
from pathlib import Path

PROMPTS = Path(__file__).resolve().parent / "prompts"
PAST_CHARS = 300  # of each past observation: the current one matters most
NOW_CHARS = 1200
RECIPE_CHARS = 400
NUMBER = re.compile(r"\d+")

# Kinds of command, most useful first (a rule of thumb for text games): finish the meal,
# read the recipe, prepare and gather ingredients, open and move, and only then the rest.
# "eat" other than the meal comes late: eating an ingredient can lose a cooking game.
TIERS = [
    r"eat meal", r"prepare meal", r"(examine|read) (cookbook|recipe|note)",
    r"(slice|dice|chop|cook|grill|roast|fry) .*", r"take .*", r"(open|unlock) .*",
    r"(insert|put) .*", r"go .*", r"(drink|eat) .*", r"(close|lock|drop) .*",
    r"examine .*", r"(look|inventory)",
]  # fmt: skip
TIER_PATTERNS = [re.compile(pattern) for pattern in TIERS]
# Words that say nothing about which object matters.
STOPWORDS = {
    "a", "an", "the", "of", "to", "in", "on", "into", "from", "with", "and", "then", "that",
    "this", "your", "you", "is", "it", "be", "for", "at", "all", "are", "its", "once", "let",
}  # fmt: skip
# A cooking game's real goal is in its recipe, shown once the cookbook is read.
RECIPE = re.compile(r"ingredients:", re.IGNORECASE)
PREPARATION = re.compile(r"(?P<verb>slice|dice|chop|cook) (?P<item>.+?) with (?P<tool>.+)")
COOKING_TOOLS = {"stove": "fry", "oven": "roast", "bbq": "grill"}
PARTICIPLES = {"slice": "sliced", "dice": "diced", "chop": "chopped", "fry": "fried",
               "roast": "roasted", "grill": "grilled"}  # fmt: skip


def run(task, ctx):
    knobs = ctx.knobs
    state = ctx.env.reset()
    goal = state.get("objective", "")
    goal_words = words_of(goal)
    past = []  # (command, what the game answered)
    played = set()
    recipe = ""
    seen = state.get("observation", "").lower()  # to tell what is already cut or cooked
    observation = state
    done = False
    steps = 0
    while not done:
        commands = observation.get("admissible_commands")
        text = observation.get("observation", "")
        if knobs["list_commands"] and commands:
            listed = order_commands(commands, played, goal_words, knobs, recipe=recipe, seen=seen)
            command = choose(ctx, goal, past, text, listed, knobs)
        else:
            command = write(ctx, goal, past, text, knobs)
        played.add(command)
        result = ctx.env.step(command)
        steps += 1
        observation = result["observation"]
        done = result["done"]
        answer = observation.get("observation", "")
        past.append((command, answer))
        seen += "\n" + answer.lower()
        if RECIPE.search(answer) and not recipe:
            recipe = " ".join(answer.lower().split())
            goal = f"{goal} Recipe: {clip(answer, RECIPE_CHARS)}"
            goal_words = words_of(answer)
            ctx.log(f"step {steps}: read the recipe")
        if result["reward"]:
            # Progress changes what is possible: what failed before may work now.
            played.clear()
            ctx.log(f"step {steps}: {command!r} scored {result['reward']:+g}")
    ctx.log(
        f"ended after {steps} steps: {observation.get('score')}/{observation.get('max_score')} "
        f"points, won={observation.get('won')}"
    )
    return {"steps": steps, "score": observation.get("score"), "won": observation.get("won")}


def order_commands(commands, played, goal_words, knobs, *, recipe="", seen=""):
    if knobs["order"] == "priority":

        def rank(command):
            tier = next(
                (i for i, p in enumerate(TIER_PATTERNS) if p.fullmatch(command)), len(TIERS)
            )
            wanted = preparation_wanted(command, recipe, seen)
            if wanted is not None:
                # Cutting or cooking what the recipe does not ask for (again) ruins the meal.
                return (not wanted, 0 if wanted else 1, 0 if wanted else len(TIERS))
            # Commands already played rarely help twice; among the rest, those naming more
            # of the goal's words come first, then by kind.
            return (command in played, -goal_match(command, goal_words), tier)

        commands = sorted(commands, key=rank)
    return list(commands)[: knobs["max_listed"]]


def preparation_wanted(command, recipe, seen):
    """Whether a cut or cook command is a step of the recipe not done yet; None for others."""
    match = PREPARATION.fullmatch(command)
    if not match:
        return None
    verb, item, tool = match.group("verb"), match.group("item"), match.group("tool")
    verb = COOKING_TOOLS.get(tool, verb) if verb == "cook" else verb
    if verb not in PARTICIPLES:
        return False
    done = rf"\b{PARTICIPLES[verb]}\b[\w ]*\b{re.escape(item)}\b"
    return f"{verb} the {item}" in recipe and not re.search(done, seen)


def goal_match(command, goal_words):
    """How many of the goal's words a command names (moving objects away counts only when
    the goal names the whole move, as in "put the lettuce on the stove")."""
    words = words_of(command)
    verb = command.split(" ", 1)[0]
    if verb in ("eat", "drink", "drop", "close", "lock") and command != "eat meal":
        return 0
    if verb in ("put", "insert") and not words <= goal_words | {verb}:
        return 0
    return len(words & goal_words)


def words_of(text):
    return set(re.findall(r"[a-z]+", text.lower())) - STOPWORDS


def history_text(past, knobs):
    if knobs["history"] <= 0 or not past:
        return ""
    lines = ["", "Recent steps:"]
    for command, answer in past[-knobs["history"] :]:
        lines.append(f"> {command}")
        lines.append(clip(answer, PAST_CHARS))
    return "\n".join(lines) + "\n"


def choose(ctx, objective, past, text, listed, knobs):
    prompt = template("choose.txt").format(
        objective=objective,
        history=history_text(past, knobs),
        observation=clip(text, NOW_CHARS),
        commands="\n".join(f"{i}. {c}" for i, c in enumerate(listed, start=1)),
    )
    reply = ctx.llm.complete(
        prompt, max_tokens=knobs["max_tokens"], temperature=knobs["temperature"], stop=["\n"]
    ).text
    match = NUMBER.search(reply)
    if match and 1 <= int(match.group()) <= len(listed):
        return listed[int(match.group()) - 1]
    ctx.log(f"no listed number in {reply!r}; playing {listed[0]!r}")
    return listed[0]


def write(ctx, objective, past, text, knobs):
    prompt = template("free.txt").format(
        objective=objective, history=history_text(past, knobs), observation=clip(text, NOW_CHARS)
    )
    reply = ctx.llm.complete(
        prompt,
        max_tokens=max(knobs["max_tokens"], 12),
        temperature=knobs["temperature"],
        stop=["\n"],
    ).text
    command = reply.strip().strip(">").strip()
    return command or "look"


def clip(text, limit):
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


_TEMPLATES = {}


def template(name):
    if name not in _TEMPLATES:
        _TEMPLATES[name] = (PROMPTS / name).read_text().rstrip("\n")
    return _TEMPLATES[name]
