"""The evolution benchmark: harness search strategies from a naive seed, on the embedded stack.

Each (strategy, seed) is one campaign from ``examples/textworld-naive`` (a plausible first
attempt: the game's own command order, one past step, 60 listed commands) on a slice of the
TextWorld suite (``coevo.demo.campaign.demo_textworld_suite``), every campaign with the same
rollout budget. Strategies: ``config`` (Optuna TPE over the demo's knobs), ``random`` (uniform
draws over the same knobs), ``llm-patch`` and ``agentic`` (Gemma 3 270M, the policy itself,
as the proposer; agentic runs ``examples/proposers/agentic`` in its one-shot mode). The policy
is llama.cpp serving Gemma 3 270M (or COEVO_POLICY_URL), run by one Celery worker.

Per campaign: the validation gain of its best over the seed (paired, 95% interval:
``evaluation_compare``), and the held-out gain, from a promotion request of the best to an empty
channel of its own (``bench-<strategy>-<seed>``), whose evidence compares it with the campaign's
seed on the sealed held-out split (docs/architecture.md, "The held-out seal": held-out scores only through promotions, never
an evaluation of the held-out split started here). A best that is the seed is not promoted; its
gain is 0 and not significant. The row also holds the HDA split of the search-set gain (what
held out, what did not), the rollouts and proposer tokens spent, the rollouts racing saved and
the proposals by state. Rows are appended to a JSON-lines file as each campaign ends; a rerun
with the same file skips the (strategy, seed) pairs it holds.

    .venv/bin/python benchmarks/evolution.py --strategies config random --seeds 0 1 \\
        --games 2 --heldout 6 --max-steps 12 --rollouts 20          # a small run
    .venv/bin/python benchmarks/evolution.py                          # the full run (4 x 5)
    .venv/bin/python benchmarks/evolution.py --report var/bench-evolution/results.jsonl

The embedded default (SQLite and the filesystem broker) lives under COEVO_HOME, by default
var/bench-evolution; DATABASE_URL and CELERY_BROKER_URL are used when given. Ctrl-C stops the
running campaign and the child processes (llama.cpp, the worker).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

STRATEGIES = ("config", "random", "llm-patch", "agentic")
# Proposers that write with a model (the rest draw knob values and spend no proposer tokens).
MODEL_PROPOSERS = ("llm-patch", "agentic")
# The target is judged on this many campaigns a strategy.
TARGET_CAMPAIGNS = 5
DEFAULT_HOME = REPO / "var" / "bench-evolution"
# A results line longer than this is not one this script wrote.
MAX_LINE_CHARS = 100_000
MAX_ROWS = 10_000
# The held-out runs' sampling seed, the same for every campaign: the seed candidate's held-out
# evaluation is then one run, reused by every promotion (a reference evaluation of the same
# settings is reused, coevo.reviews.promotions.create), and every campaign is compared with it.
PROMOTION_SEED = 0
# Seconds between progress lines when nothing changed, and between nudges of the campaign (what
# beat does in production; the evaluation_finished signal drives it, this covers a lost message).
PROGRESS_EVERY_S = 60
NUDGE_EVERY_S = 30
# Gemma 3 270M as a proposer: llama.cpp serves a 4,096-token context, so the prompt (the
# campaign's record) and the answer must fit in it (tests/integration/test_llm_patch_gemma.py).
LLM_PATCH_OPTIONS = {"api": "completions", "max_tokens": 400, "temperature": 0.8,
                     "workspace_chars": 4000}  # fmt: skip
# examples/proposers/agentic/harness.toml: the one-shot mode for a small model without tools.
AGENTIC_KNOBS = {"mode": "oneshot", "api": "completions", "record_chars": 2000,
                 "file_chars": 4000, "max_tokens": 400}  # fmt: skip


# --- the results file and the report (no Django: --report runs without a database) -----------


def results_read(path: Path) -> list[dict[str, Any]]:
    """The rows of a results file (none if it does not exist yet)."""
    if not path.exists():
        return []
    rows = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            if len(line) > MAX_LINE_CHARS or len(rows) >= MAX_ROWS:
                raise SystemExit(
                    f"{path}:{number}: not a results file of this benchmark (a line over "
                    f"{MAX_LINE_CHARS:,} characters or over {MAX_ROWS:,} rows); pass another "
                    "--results file."
                )
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SystemExit(
                    f"{path}:{number}: not JSON ({exc.msg}); a run cut off mid-write leaves a "
                    "partial last line: delete that line and run again."
                ) from None
            if not isinstance(row, dict) or "strategy" not in row or "seed" not in row:
                raise SystemExit(
                    f"{path}:{number}: not a row of this benchmark (no strategy/seed)."
                )
            rows.append(row)
    return rows


def results_append(path: Path, row: dict[str, Any]) -> None:
    """One row, flushed to disk before the next campaign starts (a long run loses nothing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps(row, sort_keys=True) + "\n")
        out.flush()
        os.fsync(out.fileno())


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def _pct(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "n/a"
    return f"{value * 100:+.1f}" if signed else f"{value * 100:.1f}"


def _beats(side: dict[str, Any] | None) -> bool:
    """Better than the seed and significant (not merely different)."""
    return bool(side and side.get("significant") and (side.get("difference") or 0) > 0)


@dataclass(frozen=True)
class StrategySummary:
    strategy: str
    campaigns: int
    validation_gain: float | None
    validation_low: float | None
    validation_high: float | None
    validation_significant: int
    heldout_campaigns: int  # with held-out evidence (a failed promotion has none)
    heldout_gain: float | None
    heldout_low: float | None
    heldout_high: float | None
    heldout_significant: int
    search_gain: float | None
    held_out_part: float | None
    not_held_out_part: float | None
    rollouts: float
    proposer_tokens: float
    rollouts_saved: float
    valid: int
    judged: int
    best_is_seed: int
    wall_s: float

    @property
    def heldout_share(self) -> float:
        return self.heldout_significant / self.campaigns if self.campaigns else 0.0


def strategy_summaries(rows: Sequence[dict[str, Any]]) -> list[StrategySummary]:
    """Per strategy, in STRATEGIES order: means over its campaigns and the count of campaigns
    whose best beat the seed significantly (each campaign's own paired interval)."""
    summaries = []
    known = [s for s in STRATEGIES if any(r["strategy"] == s for r in rows)]
    others = sorted({r["strategy"] for r in rows} - set(STRATEGIES))
    for strategy in known + others:
        mine = [r for r in rows if r["strategy"] == strategy]
        val = [r.get("validation") or {} for r in mine]
        held = [
            r["heldout"] for r in mine if (r.get("heldout") or {}).get("difference") is not None
        ]
        hda = [r.get("hda") or {} for r in mine]
        summaries.append(
            StrategySummary(
                strategy=strategy,
                campaigns=len(mine),
                validation_gain=_mean(v.get("difference") for v in val),
                validation_low=_mean(v.get("low") for v in val),
                validation_high=_mean(v.get("high") for v in val),
                validation_significant=sum(_beats(v) for v in val),
                heldout_campaigns=len(held),
                heldout_gain=_mean(h["difference"] for h in held),
                heldout_low=_mean(h.get("low") for h in held),
                heldout_high=_mean(h.get("high") for h in held),
                heldout_significant=sum(_beats(h) for h in held),
                search_gain=_mean(h.get("search_gain") for h in hda),
                held_out_part=_mean(h.get("heldout_gain") for h in hda),
                not_held_out_part=_mean(h.get("gap") for h in hda),
                rollouts=statistics.fmean(r.get("rollouts", 0) for r in mine),
                proposer_tokens=statistics.fmean(r.get("proposer_tokens", 0) for r in mine),
                rollouts_saved=statistics.fmean(r.get("rollouts_saved", 0) for r in mine),
                valid=sum(r.get("valid", 0) for r in mine),
                judged=sum(r.get("judged", 0) for r in mine),
                best_is_seed=sum(r.get("best") == "the seed" for r in mine),
                wall_s=statistics.fmean(r.get("wall_s", 0) for r in mine),
            )
        )
    return summaries


def valid_share_by_model(rows: Sequence[dict[str, Any]]) -> list[tuple[str, str, int, int]]:
    """(proposer model, strategy, valid, judged) for the proposers that write with a model:
    valid = proposals that reached evaluation; judged = those plus the ones a stage rejected
    (a proposal never judged because the budget ran out counts in neither)."""
    totals: dict[tuple[str, str], list[int]] = {}
    for row in rows:
        if row["strategy"] not in MODEL_PROPOSERS:
            continue
        entry = totals.setdefault((row.get("proposer_model") or "?", row["strategy"]), [0, 0])
        entry[0] += row.get("valid", 0)
        entry[1] += row.get("judged", 0)
    return [(model, strategy, v, j) for (model, strategy), (v, j) in sorted(totals.items())]


def _interval(low: float | None, high: float | None) -> str:
    if low is None or high is None:
        return ""
    return f" [{_pct(low, True)}, {_pct(high, True)}]"


def _minutes(seconds: float) -> str:
    minutes, rest = divmod(int(round(seconds)), 60)
    return f"{minutes}m{rest:02d}s"


def report_markdown(rows: Sequence[dict[str, Any]]) -> str:
    """The markdown report of a results file: per strategy, then per campaign, then the share of
    valid proposals per proposer model, and what the figures say about the targets."""
    if not rows:
        return "No campaigns in the results file yet.\n"
    settings = sorted({json.dumps(r.get("settings", {}), sort_keys=True) for r in rows})
    lines = ["Settings: " + "; ".join(settings), ""]
    lines += [
        "Gains in points (percentage points of the mean score), best candidate minus the seed; "
        "[a, b]: the mean of the campaigns' paired 95% intervals; sig.: campaigns whose best "
        "beat the seed significantly (exact McNemar / sign test, 5%).",
        "",
        "| strategy | campaigns | validation gain [mean CI] (sig.) | held-out gain [mean CI] "
        "| beats the seed on held-out | search gain: held out / not (HDA) | rollouts "
        "| saved by racing | proposer tokens | valid proposals | best is the seed | wall |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    summaries = strategy_summaries(rows)
    for s in summaries:
        held = (
            f"{_pct(s.heldout_gain, True)}{_interval(s.heldout_low, s.heldout_high)}"
            if s.heldout_campaigns
            else "n/a"
        )
        if s.heldout_campaigns < s.campaigns:
            held += f" ({s.campaigns - s.heldout_campaigns} without evidence)"
        lines.append(
            f"| {s.strategy} | {s.campaigns} "
            f"| {_pct(s.validation_gain, True)}{_interval(s.validation_low, s.validation_high)}"
            f" ({s.validation_significant}) | {held} "
            f"| {s.heldout_significant}/{s.campaigns} ({s.heldout_share:.0%}) "
            f"| {_pct(s.search_gain, True)}: {_pct(s.held_out_part, True)} / "
            f"{_pct(s.not_held_out_part, True)} "
            f"| {s.rollouts:.1f} | {s.rollouts_saved:.1f} | {s.proposer_tokens:,.0f} "
            f"| {s.valid}/{s.judged}"
            + (f" ({s.valid / s.judged:.0%})" if s.judged else "")
            + f" | {s.best_is_seed}/{s.campaigns} | {_minutes(s.wall_s)} |"
        )
    lines += [
        "",
        "| strategy | seed | best | seed search / validation | best search / validation "
        "| validation gain [CI] p | held-out gain [CI] p | search gain, gap "
        "| rollouts (saved) | proposer tokens | proposals | wall |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (_order(r["strategy"]), r["seed"])):
        lines.append(
            f"| {r['strategy']} | {r['seed']} | {r.get('best', '?')} "
            f"| {_pct(r.get('seed_search'))} / {_pct(r.get('seed_validation'))} "
            f"| {_pct(r.get('best_search'))} / {_pct(r.get('best_validation'))} "
            f"| {_side(r.get('validation'))} | {_side(r.get('heldout'))} "
            f"| {_pct((r.get('hda') or {}).get('search_gain'), True)}, "
            f"{_pct((r.get('hda') or {}).get('gap'), True)} "
            f"| {r.get('rollouts', 0)} ({r.get('rollouts_saved', 0)}) "
            f"| {r.get('proposer_tokens', 0):,} "
            f"| {_states(r.get('proposals') or {})} | {_minutes(r.get('wall_s', 0))} |"
        )
    shares = valid_share_by_model(rows)
    if shares:
        lines += ["", "| proposer model | strategy | valid proposals (reached evaluation) |",
                  "|---|---|---|"]  # fmt: skip
        for model, strategy, valid, judged in shares:
            share = f" ({valid / judged:.0%})" if judged else ""
            lines.append(f"| {model} | {strategy} | {valid}/{judged}{share} |")
    notes = report_notes(summaries)
    if notes:
        lines += [""] + [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


def report_notes(summaries: Sequence[StrategySummary]) -> list[str]:
    """What the figures say about the issue's targets, in words, with the figures."""
    notes = []
    by_name = {s.strategy: s for s in summaries}
    config, random = by_name.get("config"), by_name.get("random")
    if config is not None:
        wanted = math.ceil(0.8 * config.campaigns)
        met = "met" if config.heldout_significant >= wanted else "not met"
        if config.campaigns < TARGET_CAMPAIGNS:
            # A partial run says what it has, not a verdict on a target it has not run.
            met = f"not measured yet ({config.campaigns} of {TARGET_CAMPAIGNS} campaigns run)"
        notes.append(
            f"Target (config improves held-out significantly in at least 4 of 5 campaigns): "
            f"{met}: {config.heldout_significant} of {config.campaigns}."
        )
    if config is not None and random is not None:
        notes.append(
            f"Config vs random at {config.rollouts:.1f} / {random.rollouts:.1f} rollouts a "
            f"campaign: mean held-out gain {_pct(config.heldout_gain, True)} vs "
            f"{_pct(random.heldout_gain, True)} points, validation "
            f"{_pct(config.validation_gain, True)} vs {_pct(random.validation_gain, True)}."
        )
    for s in summaries:
        if s.campaigns and s.best_is_seed == s.campaigns:
            valid = f"{s.valid} of {s.judged} proposals valid" if s.judged else "no proposals"
            notes.append(
                f"{s.strategy} gained nothing: in all {s.campaigns} campaigns the best on "
                f"validation was the seed ({valid}, {s.proposer_tokens:,.0f} proposer tokens "
                "a campaign)."
            )
    return notes


def _order(strategy: str) -> int:
    return STRATEGIES.index(strategy) if strategy in STRATEGIES else len(STRATEGIES)


def _side(side: dict[str, Any] | None) -> str:
    if not side or side.get("difference") is None:
        return "n/a" + (f" ({side['state']})" if side and side.get("state") else "")
    p_value = side.get("p_value")
    return (
        f"{_pct(side['difference'], True)}{_interval(side.get('low'), side.get('high'))}"
        + (f" p={p_value:.2g}" if p_value is not None else "")
        + (" *" if _beats(side) else "")
    )


def _states(states: dict[str, int]) -> str:
    return ", ".join(f"{n} {state}" for state, n in sorted(states.items())) or "none"


# --- running the campaigns (Django set up first: COEVO_HOME decides the database) -------------


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategies", nargs="+", choices=STRATEGIES, default=list(STRATEGIES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4],
                        help="campaign seeds (each strategy runs one campaign per seed)")  # fmt: skip
    parser.add_argument("--games", type=int, default=2, help="games in search and in validation")
    # 10: significance on held-out needs games (the exact sign test reaches p < 0.05 only with
    # at least 6 discordant games, so a candidate that wins 60% of games needs about 10).
    parser.add_argument("--heldout", type=int, default=10, help="held-out games (at most 10)")
    parser.add_argument("--max-steps", type=int, default=12, help="steps a game")
    # 40: about 9 proposals of 2 + 2 games, so TPE acts after its 3 random start-up draws (at
    # 20, 5-6 proposals were mostly start-up draws and config could not differ from random).
    parser.add_argument("--rollouts", type=int, default=40,
                        help="rollout budget of every campaign (search and validation)")  # fmt: skip
    parser.add_argument("--max-proposals", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=1,
                        help="proposals per round; above 1 their search runs are raced")  # fmt: skip
    parser.add_argument("--campaign-timeout", type=int, default=3 * 3600,
                        help="seconds before a campaign is stopped (its row says so)")  # fmt: skip
    parser.add_argument("--results", type=Path, default=None,
                        help="JSON lines, one row per campaign (default COEVO_HOME/results.jsonl)")  # fmt: skip
    parser.add_argument("--report", type=Path, metavar="FILE",
                        help="print the markdown report of a results file and exit")  # fmt: skip
    parser.add_argument("--policy-port", type=int, default=8090, help="llama.cpp server port")
    args = parser.parse_args(argv)
    for name, low, high in (("seeds", 1, 100), ("games", 1, 10), ("heldout", 1, 10),
                            ("max_steps", 1, 100), ("rollouts", 1, 10_000),
                            ("max_proposals", 1, 200), ("batch_size", 1, 16),
                            ("campaign_timeout", 60, 7 * 86_400)):  # fmt: skip
        value = len(args.seeds) if name == "seeds" else getattr(args, name)
        if not low <= value <= high:
            parser.error(f"--{name.replace('_', '-')} must be between {low} and {high}")
    return args


def run_settings(args: argparse.Namespace) -> dict[str, Any]:
    """What must be the same for rows to be compared (one results file holds one setting)."""
    return {
        "games": args.games,
        "heldout": args.heldout,
        "max_steps": args.max_steps,
        "rollouts": args.rollouts,
        "max_proposals": args.max_proposals,
        "batch_size": args.batch_size,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = _arguments(argv)
    if args.report is not None:
        if not args.report.exists():
            raise SystemExit(f"{args.report}: no such results file; run the benchmark first.")
        print(report_markdown(results_read(args.report)), end="")
        return 0
    os.environ.setdefault("COEVO_HOME", str(DEFAULT_HOME))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "coevo.settings")
    os.environ.setdefault("COEVO_LOG_LEVEL", "WARNING")
    results = args.results or Path(os.environ["COEVO_HOME"]) / "results.jsonl"
    rows = results_read(results)
    wanted = run_settings(args)
    other = [r for r in rows if r.get("settings") != wanted]
    if other:
        raise SystemExit(
            f"{results} holds {len(other)} row(s) run with other settings "
            f"({other[0].get('settings')}, not {wanted}): pass another --results file, or the "
            "same settings to resume."
        )
    done = {(r["strategy"], r["seed"]) for r in rows}
    todo = [(s, seed) for s in args.strategies for seed in args.seeds if (s, seed) not in done]
    print(
        f"evolution benchmark: {len(todo)} campaign(s) to run, {len(done)} already in {results}; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, load "
        f"{os.getloadavg()[0]:.2f}",
        flush=True,
    )
    if not todo:
        print(report_markdown(rows), end="")
        return 0
    import django

    django.setup()
    # Everything below reads or writes the database: importable only once Django is set up.
    from benchmarks.evolution_run import run_campaigns

    try:
        run_campaigns(args=args, todo=todo, results=results, settings_row=wanted)
    except KeyboardInterrupt:
        # run_campaigns stopped the running campaign and the children; the rows written stay.
        print(f"\ninterrupted: rerun the same command to resume from {results}", flush=True)
        return 130
    print(report_markdown(results_read(results)), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
