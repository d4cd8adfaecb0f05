"""The CLI end to end: a live server (pytest-django's ``live_server``), a real Celery worker, the
scripted policy, a user repository made with the git CLI; ``submit`` → ``gate --wait`` → exit code.

The suite is a four-task custom JSONL suite (a gate has no task limit, and two evaluations of
HumanEval's validation split would take minutes)."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from coevo.cli import main
from tests.cli.conftest import run_git
from tests.support.factories import jsonl_rows, make_jsonl_suite

pytestmark = pytest.mark.django_db(transaction=True)

REPO_ROOT = Path(__file__).resolve().parents[2]

MANIFEST = """
[harness]
name = "arith"
entrypoint = "agent:run"
policy_api = "completions"

[limits]
max_model_calls = 2
wall_time_s = 30
"""

ASKS_THE_MODEL = """
def run(task, ctx):
    return ctx.llm.complete(task["input"], max_tokens=8, temperature=0.0).texts[0].strip()
"""

GUESSES = """
def run(task, ctx):
    return "I do not know"
"""

TASKS = [("mul", "6 * 7 =", "42"), ("add", "2 + 3 =", "5"), ("sub", "9 - 4 =", "5")]


@pytest.fixture
def arith_suite(project):
    return make_jsonl_suite(project, jsonl_rows(TASKS, split="validation"), name="arith")


@pytest.fixture
def user_repo(tmp_path) -> Path:
    """A harness repository: a guessing harness, then one that asks the model."""
    repo = tmp_path / "my-harness"
    repo.mkdir()
    run_git(repo, "init", "-q", "-b", "main")
    (repo / "harness.toml").write_text(MANIFEST)
    (repo / "agent.py").write_text(textwrap.dedent(GUESSES))
    run_git(repo, "add", "-A")
    run_git(repo, "commit", "-q", "-m", "guess")
    (repo / "agent.py").write_text(textwrap.dedent(ASKS_THE_MODEL))
    run_git(repo, "commit", "-q", "-am", "ask the model")
    return repo


@pytest.fixture
def cli_env(monkeypatch, live_server, project, owner):
    from coevo.accounts.services import token_create

    _, raw = token_create(
        user=owner,
        name="ci",
        kind="ci",
        scopes=["read", "candidates:write", "evaluations:run"],
        created_by=owner,
    )
    env = {"COEVO_URL": live_server.url, "COEVO_TOKEN": raw, "COEVO_PROJECT": project.slug}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def test_it_submits_and_gates_against_production_through_the_api(
    cli_env,
    user_repo,
    project,
    owner,
    arith_suite,
    policy_version,
    scripted_policy,
    celery_worker_thread,
    capsys,
):
    from coevo.reviews.services import channel_get_or_create, channel_move
    from harness_store.selectors import candidate_get

    scripted_policy.rules = [(prompt, answer) for _, prompt, answer in TASKS]
    guess = run_git(user_repo, "rev-parse", "HEAD~1")
    asks = run_git(user_repo, "rev-parse", "HEAD")

    # The guessing harness is in production.
    assert main(["submit", str(user_repo), "--ref", "HEAD~1"]) == 0
    out, _ = capsys.readouterr()
    assert out.splitlines()[0] == guess
    channel_move(
        channel=channel_get_or_create(project=project, name="production"),
        candidate=candidate_get(project=project, sha=guess),
        policy_version=policy_version,
        moved_by=owner,
    )

    # CI submits the new commit: only it travels (the server has its parent).
    assert main(["submit", str(user_repo), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["sha"] == asks
    assert "excluding 1 commits the server has" in err
    assert candidate_get(project=project, sha=asks).parent_shas == [guess]

    gate = ["gate", "--suite", "arith", "--wait", "--interval", "0.2", "--timeout", "120"]
    # No --max-regression: on three tasks it is inconclusive (too few for its interval).
    code = main([*gate, "--candidate", asks, "--against", "production", "--min-score", "0.9",
                 "--json"])  # fmt: skip
    out, err = capsys.readouterr()
    final = json.loads(out)
    assert (code, final["verdict"]) == (0, "pass"), (final, err)
    assert final["baseline"] == guess and final["candidate"] == asks
    assert "gate running" in err or "gate pending" in err

    # The other way round the gate fails, with its reasons on stdout.
    code = main([*gate, "--candidate", guess, "--against", asks, "--min-score", "0.9"])
    out, err = capsys.readouterr()
    assert code == 1, (out, err)
    assert out.splitlines()[0] == "verdict: fail"
    assert "fail: min_score:" in out

    code = main(["evaluate", "--candidate", asks, "--suite", "arith", "--epochs", "2", "--wait",
                 "--interval", "0.2", "--timeout", "120"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, (out, err)
    assert re.search(
        r" finished; mean 1\.000 \[0\.\d+, 1\.000\] over 3 tasks$", out.splitlines()[0]
    )
    assert "6/6 rollouts, mean 1.00" in err


def test_the_installed_console_script_submits(cli_env, user_repo, project):
    from harness_store.selectors import candidate_get

    coevo = Path(sys.executable).with_name("coevo")
    helped = subprocess.run(
        [str(coevo), "gate", "--help"], capture_output=True, text=True, timeout=60
    )
    assert helped.returncode == 0, helped.stderr
    assert "--max-regression" in helped.stdout

    submitted = subprocess.run(
        [str(coevo), "submit", str(user_repo)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **cli_env},
    )
    assert submitted.returncode == 0, submitted.stderr
    sha = run_git(user_repo, "rev-parse", "HEAD")
    assert submitted.stdout.splitlines()[0] == sha
    assert cli_env["COEVO_TOKEN"] not in submitted.stdout + submitted.stderr
    assert candidate_get(project=project, sha=sha).message.startswith("ask the model")

    unauthorized = subprocess.run(
        [str(coevo), "gate", "--candidate", sha, "--against", sha, "--suite", "arith"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **cli_env, "COEVO_TOKEN": "coevo_deadbeef_not-a-token"},
    )
    assert unauthorized.returncode == 3
    assert unauthorized.stderr.strip().endswith("(not_authenticated)")


def test_budget_usd_refuses_an_evaluation_and_a_gate_whose_worst_case_exceeds_it(
    cli_env, user_repo, project, arith_suite, policy_version, capsys
):
    from decimal import Decimal

    from coevo.evaluations.models import Budget, Evaluation
    from coevo.gates.models import Gate
    from coevo.policies.prices import model_price_create

    # $2 per million output tokens; the manifest's max_tokens (16,384 by default) at that price
    # is each rollout's worst case: $0.032768, three tasks $0.098304.
    model_price_create(
        endpoint=policy_version.endpoint,
        model="",
        input_per_m=Decimal(1),
        cached_input_per_m=Decimal("0.5"),
        output_per_m=Decimal(2),
    )
    assert main(["submit", str(user_repo)]) == 0
    sha = capsys.readouterr().out.splitlines()[0]
    evaluate = ["evaluate", "--candidate", sha, "--suite", "arith"]

    assert main([*evaluate, "--budget-usd", "0.09"]) == 1
    err = capsys.readouterr().err
    assert "needs $0.0983 in policy calls" in err and "(budget_exceeded)" in err
    assert not Evaluation.objects.exists()
    gate = ["gate", "--candidate", sha, "--against", sha, "--suite", "arith", "--min-score", "0.5"]
    assert main([*gate, "--budget-usd", "0.15"]) == 3  # two evaluations: $0.196608
    assert "(budget_exceeded)" in capsys.readouterr().err
    assert not Evaluation.objects.exists() and not Gate.objects.exists()

    assert main([*evaluate, "--budget-usd", "0.1", "--json"]) == 0
    budget = Budget.objects.get(evaluation=Evaluation.objects.get())
    assert budget.limit_usd == Decimal("0.1") and budget.reserved_usd == Decimal("0.098304")


REMOTE_MODULES = sorted(
    str(path.relative_to(REPO_ROOT / "coevo" / "cli"))
    for path in (REPO_ROOT / "coevo" / "cli" / "remote").glob("*.py")
)


@pytest.mark.parametrize("module", ["client.py", "gitlocal.py", *REMOTE_MODULES])
def test_the_remote_commands_do_not_import_django_or_gitpython(module):
    tree = ast.parse((REPO_ROOT / "coevo" / "cli" / module).read_text())
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    roots = {name.split(".")[0] for name in imported}
    assert not roots & {"django", "rest_framework", "git", "celery"}
    assert not {
        name for name in imported if name.startswith("coevo.") and not name.startswith("coevo.cli")
    }
