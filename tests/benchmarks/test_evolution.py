"""benchmarks/evolution.py: the report of a results file (synthetic rows, no campaign run), the
resume and settings checks, and a smoke run of the script itself on the embedded default with
the scripted OpenAI server as the policy (a real worker, sandbox, campaign and promotion)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import evolution
from tests.support.net import free_port
from tests.support.openai_server import ScriptedOpenAIServer, ScriptedPolicy

REPO = Path(__file__).resolve().parents[2]
SETTINGS = {"games": 2, "heldout": 6, "max_steps": 12, "rollouts": 20, "max_proposals": 10,
            "batch_size": 1}  # fmt: skip
SETTINGS_ARGS = ["--games", "2", "--heldout", "6", "--max-steps", "12", "--rollouts", "20"]


def row(strategy, seed, *, val=0.0, held=0.0, significant=False, best="abc123def456", **extra):
    base = {
        "strategy": strategy,
        "seed": seed,
        "settings": SETTINGS,
        "best": best,
        "proposer_model": "gemma-3-270m" if strategy in ("llm-patch", "agentic") else "",
        "seed_search": 0.0,
        "seed_validation": 0.0,
        "best_search": val + 0.25,
        "best_validation": val,
        "validation": {
            "difference": val,
            "low": val - 0.25,
            "high": val + 0.25,
            "p_value": 0.5,
            "significant": False,
        },  # fmt: skip
        "heldout": {
            "difference": held,
            "low": held - 0.1,
            "high": held + 0.1,
            "p_value": 0.01 if significant else 0.5,
            "significant": significant,
        },  # fmt: skip
        "hda": {"search_gain": val + 0.25, "heldout_gain": held, "gap": val + 0.25 - held},
        "rollouts": 20,
        "proposer_tokens": 0,
        "rollouts_saved": 0,
        "proposals": {"evaluated": 4},
        "valid": 4,
        "judged": 4,
        "wall_s": 300.0,
    }
    return base | extra


def write(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def seed_row(strategy, seed, **extra):
    same = {"difference": 0.0, "low": 0.0, "high": 0.0, "p_value": 1.0, "significant": False}
    return row(strategy, seed, best="the seed", validation=same, heldout=same,
               hda={"search_gain": 0.0, "heldout_gain": 0.0, "gap": 0.0}, **extra)  # fmt: skip


def test_it_summarizes_each_strategy_over_its_campaigns():
    rows = [row("config", s, val=0.5, held=0.4, significant=s < 4) for s in range(5)]
    rows += [row("random", 0, val=0.5, held=0.3, significant=True, rollouts=18)]
    rows += [row("random", s, val=0.25, held=-0.1, rollouts=18) for s in range(1, 5)]
    config, random = evolution.strategy_summaries(rows)

    assert (config.strategy, config.campaigns, config.heldout_significant) == ("config", 5, 4)
    assert config.heldout_share == 0.8
    assert config.heldout_gain == pytest.approx(0.4)
    assert (config.heldout_low, config.heldout_high) == (pytest.approx(0.3), pytest.approx(0.5))
    # HDA: the search gain splits into what held out and what did not.
    assert config.search_gain == pytest.approx(0.75)
    assert config.held_out_part + config.not_held_out_part == pytest.approx(config.search_gain)
    assert random.heldout_significant == 1 and random.rollouts == 18
    assert random.heldout_gain == pytest.approx((0.3 - 0.4) / 5)


def test_it_counts_only_gains_as_beating_the_seed():
    worse = row("config", 0, held=-0.5, significant=True)
    (summary,) = evolution.strategy_summaries([worse])
    assert summary.heldout_significant == 0


def test_it_leaves_campaigns_without_held_out_evidence_out_of_the_held_out_means():
    failed = row("config", 1, heldout={"difference": None, "state": "failed: infra"})
    rows = [row("config", 0, held=0.5), failed]
    (summary,) = evolution.strategy_summaries(rows)
    assert (summary.campaigns, summary.heldout_campaigns) == (2, 1)
    assert summary.heldout_gain == 0.5
    report = evolution.report_markdown(rows)
    assert "+50.0 [+40.0, +60.0] (1 without evidence)" in report
    assert "| n/a (failed: infra) |" in report


def test_the_report_says_whether_the_targets_were_met_and_what_gained_nothing():
    rows = [row("config", s, val=0.5, held=0.4, significant=s < 4) for s in range(5)]
    rows += [row("random", s, val=0.25, held=0.1) for s in range(5)]
    rows += [seed_row("llm-patch", s, valid=1, judged=4, proposer_tokens=900) for s in range(5)]
    report = evolution.report_markdown(rows)

    assert "| config | 5 | +50.0 [+25.0, +75.0] (0) | +40.0 [+30.0, +50.0] | 4/5 (80%)" in report
    assert "met: 4 of 5" in report and "not met" not in report
    assert "mean held-out gain +40.0 vs +10.0 points" in report
    assert "llm-patch gained nothing: in all 5 campaigns the best on validation was the seed " \
        "(5 of 20 proposals valid, 900 proposer tokens a campaign)" in report  # fmt: skip
    # Item 8: the share of valid proposals per proposer model.
    assert "| gemma-3-270m | llm-patch | 5/20 (25%) |" in report
    assert report.count("\n| llm-patch | ") == 1 + 5  # the summary row and one per campaign


def test_a_partial_run_does_not_call_the_target_met():
    rows = [row("config", s, val=0.5, held=0.4, significant=True) for s in range(2)]
    report = evolution.report_markdown(rows)
    assert "not measured yet (2 of 5 campaigns run): 2 of 2" in report
    assert ": met:" not in report


def test_it_prints_the_report_of_a_file_without_running_anything(tmp_path, capsys):
    path = write(tmp_path / "results.jsonl", [row("random", 3, val=0.5, held=0.25)])
    assert evolution.main(["--report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| random | 3 | abc123def456 |" in out


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"strategy": "config", "seed": 0}\n{"strategy": "conf', "delete that line"),
        ("[1, 2]\n", "not a row of this benchmark"),
        ("x" * (evolution.MAX_LINE_CHARS + 1) + "\n", "pass another --results file"),
    ],
)
def test_it_refuses_what_is_not_a_results_file(tmp_path, text, message):
    path = tmp_path / "results.jsonl"
    path.write_text(text)
    with pytest.raises(SystemExit, match=message):
        evolution.main(["--report", str(path)])


def test_it_refuses_to_mix_settings_in_one_results_file(tmp_path):
    path = write(tmp_path / "results.jsonl", [row("config", 0)])
    with pytest.raises(SystemExit, match="run with other settings .* pass another --results"):
        evolution.main(["--results", str(path), "--strategies", "config", "--seeds", "0",
                        "--games", "3", "--heldout", "6", "--max-steps", "12"])  # fmt: skip


def test_it_skips_the_campaigns_the_file_already_holds(tmp_path, capsys):
    path = write(tmp_path / "results.jsonl", [row("config", 0), row("config", 1)])
    args = ["--results", str(path), "--strategies", "config", "--seeds", "0", "1"]
    assert evolution.main(args + SETTINGS_ARGS) == 0
    out = capsys.readouterr().out
    assert "0 campaign(s) to run, 2 already in" in out and "| config | 2 |" in out


@pytest.mark.parametrize(
    ("flag", "value"), [("--heldout", "11"), ("--rollouts", "0"), ("--batch-size", "17")]
)
def test_it_bounds_its_inputs(flag, value, capsys):
    with pytest.raises(SystemExit):
        evolution.main([flag, value])
    assert f"{flag} must be between" in capsys.readouterr().err


@pytest.mark.timeout(300)
def test_a_small_run_writes_a_row_per_campaign_and_resumes(tmp_path):
    """The script as a user runs it, on the embedded default in a fresh COEVO_HOME, against the
    scripted server (it answers "1": the first listed command). Campaign seed 6's first config
    draw is order = priority, which wins points where the seed's game order does not, so the
    best is a proposal and is promoted; held-out games never appear in the row or the output."""
    home, results = tmp_path / "home", tmp_path / "results.jsonl"
    policy = ScriptedPolicy(default="1")
    args = [sys.executable, str(REPO / "benchmarks" / "evolution.py"), "--strategies", "config",
            "--seeds", "6", "--games", "1", "--heldout", "2", "--max-steps", "4",
            "--rollouts", "8", "--max-proposals", "2", "--results", str(results)]  # fmt: skip
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("DATABASE_URL", "CELERY_", "COEVO_", "DJANGO_"))
    }
    with ScriptedOpenAIServer(policy) as server:
        env |= {"COEVO_HOME": str(home), "COEVO_POLICY_URL": server.url,
                "COEVO_POLICY_MODEL": policy.model}  # fmt: skip
        run = subprocess.run(
            [*args, "--policy-port", str(free_port())], env=env, cwd=REPO,
            capture_output=True, text=True, timeout=280,
        )  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr
        again = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert "0 campaign(s) to run, 1 already in" in again.stdout, again.stdout + again.stderr

    (written,) = evolution.results_read(results)
    assert (written["strategy"], written["seed"], written["state"]) == ("config", 6, "finished")
    assert written["best"] != "the seed" and written["best_params"]["order"] == "priority"
    assert written["validation"]["difference"] > 0
    assert written["heldout"]["state"] == "ready" and written["heldout"]["difference"] is not None
    assert set(written["hda"]) == {"search_gain", "heldout_gain", "gap"}
    assert 0 < written["rollouts"] <= 8 and written["judged"] >= written["valid"] >= 1
    assert "| config | 1 |" in run.stdout and "campaign 1/1: config, seed 6" in run.stdout
    assert "rollouts 0+0 reserved of 8" in run.stdout
    # A project of its own: no other campaign's duplicate check or cached rollouts reach it.
    assert written["project"].startswith("bench-config-6-")
    with sqlite3.connect(home / "coevo.sqlite3") as db:
        (campaigns,) = db.execute(
            "SELECT count(*) FROM campaigns_campaign c JOIN projects_project p "
            "ON c.project_id = p.id WHERE p.slug = ?",
            (written["project"],),
        ).fetchone()
    assert campaigns == 1

    # Sealed: the held-out games' names leave the review pages in neither the row nor the output.
    with sqlite3.connect(home / "coevo.sqlite3") as db:
        keys = [k for (k,) in db.execute("SELECT key FROM suites_task WHERE split = 'heldout'")]
    assert keys
    for key in keys:
        assert key not in results.read_text() and key not in run.stdout + again.stdout
