"""``coevo promote`` end to end: a live server, a real Celery worker, the scripted policy and a
user repository made with the git CLI; ``submit`` → ``promote`` → the request's held-out runs
finish and its evidence is ready for a reviewer. And the errors CI sees."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from coevo.cli import main
from tests.cli.conftest import run_git
from tests.cli.test_remote_e2e import ASKS_THE_MODEL, GUESSES, MANIFEST
from tests.support.factories import jsonl_rows, make_jsonl_suite

pytestmark = pytest.mark.django_db(transaction=True)

# (key, prompt, answer, split): the held-out tasks decide the promotion.
TASKS = [
    ("v-mul", "3 * 3 =", "9", "validation"),
    ("h-mul", "6 * 7 =", "42", "heldout"),
    ("h-add", "2 + 3 =", "5", "heldout"),
]


@pytest.fixture
def promotion_suite(project):
    """The project's only suite with held-out tasks."""
    return make_jsonl_suite(project, jsonl_rows(TASKS), name="arith")


@pytest.fixture
def repo(tmp_path) -> Path:
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


def _token(user, scopes, kind="ci") -> str:
    from coevo.accounts.services import token_create

    _, raw = token_create(user=user, name="ci", kind=kind, scopes=scopes, created_by=user)
    return raw


@pytest.fixture
def cli_env(monkeypatch, live_server, project, owner):
    raw = _token(owner, ["read", "candidates:write", "promotions:request"])
    env = {"COEVO_URL": live_server.url, "COEVO_TOKEN": raw, "COEVO_PROJECT": project.slug}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture
def in_production(cli_env, repo, project, owner, policy_version, capsys):
    """Both commits submitted through the CLI; the guessing one is in production."""
    from coevo.reviews.services import channel_get_or_create, channel_move
    from harness_store.selectors import candidate_get

    assert main(["submit", str(repo)]) == 0
    guess = run_git(repo, "rev-parse", "HEAD~1")
    channel_move(
        channel=channel_get_or_create(project=project, name="production"),
        candidate=candidate_get(project=project, sha=guess),
        policy_version=policy_version,
        moved_by=owner,
    )
    capsys.readouterr()
    return guess


def test_it_requests_a_promotion_and_prints_where_reviewers_decide(
    cli_env,
    repo,
    project,
    promotion_suite,
    in_production,
    policy_version,
    scripted_policy,
    celery_worker_thread,
    capsys,
):
    from coevo.reviews.models import PromotionRequest, PromotionState
    from tests.reviews.conftest import wait_for_state

    scripted_policy.rules = [(prompt, answer) for _, prompt, answer, _ in TASKS]
    asks = run_git(repo, "rev-parse", "HEAD")

    code = main(["promote", "--candidate", asks[:12], "--channel", "production"])

    out, err = capsys.readouterr()
    assert code == 0, err
    request = PromotionRequest.objects.get()
    lines = out.splitlines()
    assert lines[0] == f"promotion {request.id} evaluating"
    assert lines[1] == f"{cli_env['COEVO_URL']}/p/{project.slug}/promotions/{request.id}/"
    status_url = f"{cli_env['COEVO_URL']}/api/v1/projects/{project.slug}/promotions/{request.id}/"
    assert lines[2] == f"status: {status_url}"
    assert request.candidate.sha == asks and request.holder_candidate.sha == in_production
    assert request.suite == promotion_suite  # the project's only suite with held-out tasks

    # The held-out runs finish on the worker and the evidence is assembled for reviewers.
    request = wait_for_state(request, [PromotionState.READY, PromotionState.FAILED])
    assert request.state == PromotionState.READY, request.state_detail
    assert request.evidence["comparison"]["difference"] == 1.0

    # Asking again (a re-run CI job) answers with the same open request, as JSON.
    assert main(["promote", "--candidate", asks, "--suite", "arith", "--json"]) == 0
    out, _ = capsys.readouterr()
    again = json.loads(out)
    assert again["id"] == str(request.id) and again["status_url"] == status_url
    assert PromotionRequest.objects.count() == 1


def test_it_reports_api_errors_with_their_code(
    cli_env, repo, project, owner, promotion_suite, in_production, monkeypatch, capsys
):
    asks = run_git(repo, "rev-parse", "HEAD")

    assert main(["promote", "--candidate", "f" * 40]) == 1
    _, err = capsys.readouterr()
    assert err.strip().endswith("(not_found)")

    assert main(["promote", "--candidate", asks, "--suite", "nope"]) == 1
    _, err = capsys.readouterr()
    assert err.strip().endswith("(not_found)")

    # A CI token made for gates, without promotions:request.
    monkeypatch.setenv("COEVO_TOKEN", _token(owner, ["read", "evaluations:run"]))
    assert main(["promote", "--candidate", asks]) == 1
    _, err = capsys.readouterr()
    assert "promotions:request" in err and err.strip().endswith("(scope_missing)")

    from coevo.reviews.models import PromotionRequest

    assert not PromotionRequest.objects.exists()


def test_it_picks_a_baseline_for_an_empty_channel(
    cli_env, repo, project, promotion_suite, in_production, capsys
):
    from coevo.reviews.models import PromotionRequest

    asks = run_git(repo, "rev-parse", "HEAD")

    # production holds the guesser: no baseline there, and the error says why.
    assert main(["promote", "--candidate", asks, "--baseline", in_production]) == 1
    _, err = capsys.readouterr()
    assert "A baseline is only for an empty channel" in err
    assert err.strip().endswith("(invalid_input)")

    code = main(
        ["promote", "--candidate", asks, "--channel", "staging", "--baseline", in_production[:8]]
    )

    assert code == 0, capsys.readouterr().err
    request = PromotionRequest.objects.get()
    assert request.baseline_candidate.sha == in_production and request.baseline_kind == "picked"


def test_the_promote_help_names_its_flags(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["promote", "--help"])
    assert exit_info.value.code == 0
    out, _ = capsys.readouterr()
    flags = ("--candidate", "--channel", "--suite", "--policy-version", "--epochs", "--baseline")
    for flag in (*flags, "--json"):
        assert flag in out
