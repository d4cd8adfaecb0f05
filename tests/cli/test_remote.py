"""`coevo submit / evaluate / gate` against a real HTTP server with scripted API replies."""

from __future__ import annotations

import json

import pytest

from coevo.cli import main
from tests.cli.conftest import TOKEN, commit_file, run_git

PROJECT = "/api/v1/projects/demo"
KNOWN = f"{PROJECT}/candidates/known/"
IMPORT = f"{PROJECT}/candidates/import-bundle/"


def candidate(sha: str) -> dict:
    return {"sha": sha, "dashboard_url": f"http://coevo.test/projects/demo/candidates/{sha}/"}


def uploaded_bundle(request) -> tuple[str, list[str], list[str]]:
    """(ref, heads, prerequisites) of an import-bundle request."""
    form = request.form()
    header = form["bundle"].split(b"\n\n", 1)[0].decode().splitlines()
    assert header[0] == "# v2 git bundle"
    prerequisites = [line[1:].split()[0] for line in header[1:] if line.startswith("-")]
    heads = [line.split()[0] for line in header[1:] if not line.startswith("-")]
    return form["ref"].decode(), heads, prerequisites


# -- submit ---------------------------------------------------------------------------------


def test_it_submits_the_whole_history_to_a_server_that_knows_none_of_it(api, history, capsys):
    api.on("POST", KNOWN, (200, {"known": []}))
    api.on("POST", IMPORT, (201, candidate(history.merge)))

    assert main(["submit", str(history.repo)]) == 0

    (known_request,) = api.calls("POST", KNOWN)
    shas = known_request.json()["shas"]
    assert shas[0] == history.merge and len(shas) == 5
    assert known_request.headers["authorization"] == f"Bearer {TOKEN}"
    (upload,) = api.calls("POST", IMPORT)
    ref, heads, prerequisites = uploaded_bundle(upload)
    assert (ref, heads, prerequisites) == (history.merge, [history.merge], [])
    out, err = capsys.readouterr()
    assert out.splitlines() == [history.merge, candidate(history.merge)["dashboard_url"]]
    assert TOKEN not in out + err
    assert run_git(history.repo, "for-each-ref", "refs/coevo-submit/") == ""


def test_it_uploads_only_the_commits_the_server_lacks(api, history, capsys):
    api.on("POST", KNOWN, (200, {"known": [history.a2, history.a1, history.root]}))
    api.on("POST", IMPORT, (201, candidate(history.merge)))

    assert main(["submit", str(history.repo), "--json"]) == 0

    ref, heads, prerequisites = uploaded_bundle(api.calls("POST", IMPORT)[0])
    assert heads == [history.merge]
    assert history.a2 in prerequisites and history.b1 not in prerequisites
    assert json.loads(capsys.readouterr().out) == candidate(history.merge)


def test_it_submits_another_ref_than_head(api, history, capsys):
    api.on("POST", KNOWN, (200, {"known": [history.root]}))
    api.on("POST", IMPORT, (201, candidate(history.b1)))

    assert main(["submit", str(history.repo), "--ref", "side"]) == 0

    assert api.calls("POST", KNOWN)[0].json()["shas"] == [history.b1, history.root]
    ref, heads, _ = uploaded_bundle(api.calls("POST", IMPORT)[0])
    assert ref == heads[0] == history.b1


def test_it_uploads_nothing_when_the_server_has_the_commit(api, history, capsys):
    api.on("POST", KNOWN, (200, {"known": [history.merge, history.a2]}))
    api.on("GET", f"{PROJECT}/candidates/{history.merge}/", (200, candidate(history.merge)))

    assert main(["submit", str(history.repo)]) == 0

    assert api.calls("POST", IMPORT) == []
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == history.merge
    assert "already a candidate" in err


def test_it_retries_once_with_a_full_bundle_on_missing_prerequisites(api, history, capsys):
    api.on("POST", KNOWN, (200, {"known": [history.a2, history.a1, history.root]}))
    missing = {
        "error": {
            "code": "missing_prerequisites",
            "message": "the bundle needs commits this project lacks",
            "details": {"missing": [history.a2]},
        }
    }
    api.on("POST", IMPORT, (400, missing), (201, candidate(history.merge)))

    assert main(["submit", str(history.repo)]) == 0

    first, second = api.calls("POST", IMPORT)
    assert uploaded_bundle(first)[2] != []
    assert uploaded_bundle(second)[2] == []
    assert "full history" in capsys.readouterr().err


def test_it_gives_up_after_one_full_bundle(api, history, capsys):
    api.on("POST", KNOWN, (200, {"known": []}))
    api.on(
        "POST",
        IMPORT,
        (400, {"error": {"code": "invalid_bundle", "message": "the bundle is corrupt"}}),
    )

    assert main(["submit", str(history.repo)]) == 1

    assert len(api.calls("POST", IMPORT)) == 1
    assert capsys.readouterr().err.strip().endswith("coevo: the bundle is corrupt (invalid_bundle)")


def test_it_warns_that_uncommitted_changes_are_not_submitted(api, history, capsys):
    api.on("POST", KNOWN, (200, {"known": []}))
    api.on("POST", IMPORT, (201, candidate(history.merge)))
    (history.repo / "agent.py").write_text("def run(task, ctx):\n    return 'draft'\n")

    assert main(["submit", str(history.repo)]) == 0

    err = capsys.readouterr().err
    assert "uncommitted changes" in err and history.merge[:12] in err


def test_it_refuses_a_shallow_clone_the_server_cannot_complete(api, history, tmp_path, capsys):
    shallow = tmp_path / "shallow"
    run_git(tmp_path, "clone", "-q", "--depth", "1", f"file://{history.repo}", str(shallow))
    commit_file(shallow, "c.txt", "c\n", "CI change")
    api.on("POST", KNOWN, (200, {"known": []}))

    assert main(["submit", str(shallow)]) == 1

    assert api.calls("POST", IMPORT) == []
    assert "fetch-depth: 0" in capsys.readouterr().err


def test_it_refuses_a_path_that_is_not_a_repository(api, tmp_path, capsys):
    assert main(["submit", str(tmp_path)]) == 1
    assert "not inside a git work tree" in capsys.readouterr().err
    assert api.requests == []


def test_it_asks_for_its_configuration(monkeypatch, history, capsys):
    for name in ("COEVO_URL", "COEVO_TOKEN", "COEVO_PROJECT"):
        monkeypatch.delenv(name, raising=False)

    assert main(["submit", str(history.repo), "--url", "http://127.0.0.1:9"]) == 1

    err = capsys.readouterr().err
    assert "COEVO_TOKEN, COEVO_PROJECT" in err and "(configuration)" in err


# -- evaluate -------------------------------------------------------------------------------

EVALUATION_ID = "6f1c9a52-52b8-4c1e-9d43-1d8fb0b1a001"
EVALUATION_URL = f"{PROJECT}/evaluations/{EVALUATION_ID}/"


def evaluation(state: str, done: int, mean: float | None = None) -> dict:
    return {
        "id": EVALUATION_ID,
        "state": state,
        "stop_reason": "",
        "progress": {"total": 40, "done": done, "running": 0, "pending": 40 - done, "failed": 0},
        "summary": {"mean": mean, "ci_low": None, "ci_high": None, "n_tasks": done},
        "errors": {"harness_error": 0, "infra_error": 0},
        "dashboard_url": "http://coevo.test/e/1/",
    }


def started(api) -> None:
    api.on(
        "POST",
        f"{PROJECT}/evaluations/",
        (202, {"id": EVALUATION_ID, "state": "pending", "status_url": api.url + EVALUATION_URL}),
    )


def test_it_starts_an_evaluation_and_prints_its_status_url(api, capsys):
    started(api)

    assert (
        main(["evaluate", "--candidate", "abc1234", "--suite", "humaneval", "--epochs", "2"]) == 0
    )

    assert api.calls("POST", f"{PROJECT}/evaluations/")[0].json() == {
        "candidate": "abc1234",
        "suite": "humaneval",
        "split": "validation",
        "epochs": 2,
    }
    assert f"status: {api.url}{EVALUATION_URL}" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("final_state", "exit_code"), [("finished", 0), ("failed", 1), ("cancelled", 1)]
)
def test_it_follows_an_evaluation_and_exits_by_its_final_state(api, capsys, final_state, exit_code):
    started(api)
    api.on(
        "GET",
        EVALUATION_URL,
        (200, evaluation("running", 12, 0.31)),
        (200, evaluation("running", 12, 0.31)),
        (200, evaluation(final_state, 40, 0.35)),
    )

    argv = [
        "evaluate",
        "--candidate",
        "abc1234",
        "--suite",
        "humaneval",
        "--wait",
        "--interval",
        "0.01",
    ]
    assert main(argv) == exit_code

    out, err = capsys.readouterr()
    assert err.count("12/40 rollouts, mean 0.31") == 1  # printed when progress changes
    assert "40/40 rollouts, mean 0.35" in err
    assert out.splitlines()[0].startswith(f"evaluation {EVALUATION_ID} {final_state}; mean 0.350")


def test_it_stops_waiting_at_the_timeout(api, capsys, monkeypatch):
    started(api)
    api.on("GET", EVALUATION_URL, (200, evaluation("running", 1)))
    clock = iter(range(0, 10_000, 10))
    monkeypatch.setattr("coevo.cli.remote.common.monotonic", lambda: next(clock))

    argv = ["evaluate", "--candidate", "a" * 40, "--suite", "s", "--wait", "--timeout", "30"]
    assert main(argv) == 1

    assert "still running after 30s" in capsys.readouterr().err
    assert 1 < len(api.calls("GET", EVALUATION_URL)) < 5


def test_it_renders_the_apis_errors(api, capsys):
    api.on(
        "POST",
        f"{PROJECT}/evaluations/",
        (
            403,
            {
                "error": {
                    "code": "permission_denied",
                    "message": "held-out runs only inside a promotion request",
                }
            },
        ),
    )

    assert main(["evaluate", "--candidate", "abc1234", "--suite", "humaneval"]) == 1

    out, err = capsys.readouterr()
    assert out == ""
    assert err == "coevo: held-out runs only inside a promotion request (permission_denied)\n"


def test_it_refuses_the_heldout_split_before_asking_the_server(api):
    with pytest.raises(SystemExit) as exited:
        main(["evaluate", "--candidate", "abc1234", "--suite", "s", "--split", "heldout"])
    assert exited.value.code == 2
    assert api.requests == []


# -- retries and transport errors -----------------------------------------------------------


def test_it_retries_a_busy_server(api, capsys):
    started(api)
    api.on(
        "GET",
        EVALUATION_URL,
        (503, b"<html>restarting</html>"),
        (502, b"<html>bad gateway</html>"),
        (200, evaluation("finished", 40, 0.5)),
    )

    argv = ["evaluate", "--candidate", "abc1234", "--suite", "s", "--wait"]
    assert main(argv) == 0

    err = capsys.readouterr().err
    assert "HTTP 503; retrying" in err and "HTTP 502; retrying" in err


def test_it_gives_up_on_a_server_that_stays_down(api, capsys):
    api.on("POST", f"{PROJECT}/evaluations/", (504, b"<html>gateway timeout</html>"))

    assert main(["evaluate", "--candidate", "abc1234", "--suite", "s"]) == 1

    assert len(api.calls("POST", f"{PROJECT}/evaluations/")) == 5  # 1 + 4 retries
    assert capsys.readouterr().err.endswith("HTTP 504 Gateway Timeout (server_error)\n")


def test_it_reports_an_unreachable_server_without_its_token(monkeypatch, capsys):
    monkeypatch.setenv("COEVO_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("COEVO_TOKEN", TOKEN)
    monkeypatch.setenv("COEVO_PROJECT", "demo")
    monkeypatch.setattr("coevo.cli.client.sleep", lambda seconds: None)

    assert main(["gate", "--candidate", "abc1234", "--against", "production", "--suite", "s"]) == 3

    out, err = capsys.readouterr()
    assert err.endswith("(connection_error)\n") and "cannot reach http://127.0.0.1:9/" in err
    assert TOKEN not in out + err


# -- gate -----------------------------------------------------------------------------------

GATE_ID = "0b7e3f4c-2d1a-4a8e-bb1e-6c0f2a9d7777"
GATE_URL = f"{PROJECT}/gates/{GATE_ID}/"
GATE_ARGS = ["gate", "--candidate", "abc1234", "--against", "production", "--suite", "humaneval"]


CANDIDATE_EVALUATION = "11111111-2222-4333-8444-555555555555"
BASELINE_EVALUATION = "99999999-8888-4777-8666-555555555555"


def gate_object(
    state: str,
    verdict: str | None,
    reasons: list[dict] | None = None,
    evaluation_states: tuple[str, str] = ("running", "finished"),
) -> dict:
    """The shape of docs/api.md's gate (coevo/api/gates.py)."""
    return {
        "id": GATE_ID,
        "state": state,
        "state_detail": "",
        "verdict": verdict,
        "reasons": reasons or [],
        "statistics": {},
        "candidate": "abc1234" + "0" * 33,
        "baseline": "f" * 40,
        "against": "production",
        "evaluations": {
            "candidate": {"id": CANDIDATE_EVALUATION, "state": evaluation_states[0]},
            "baseline": {"id": BASELINE_EVALUATION, "state": evaluation_states[1]},
            "comparison_url": "http://coevo.test/c/",
        },
        "dashboard_url": "http://coevo.test/g/1/",
    }


def reason(rule: str, outcome: str, message: str) -> dict:
    return {"rule": rule, "outcome": outcome, "message": message}


def gate_created(api) -> None:
    api.on(
        "POST",
        f"{PROJECT}/gates/",
        (202, {"id": GATE_ID, "state": "pending", "status_url": GATE_URL}),
    )


def test_it_sends_every_gate_flag(api, capsys):
    gate_created(api)
    argv = [
        *GATE_ARGS,
        "--split", "search", "--epochs", "3", "--min-score", "0.4", "--max-regression", "0.05",
        "--confidence", "0.9", "--critical-task", "HumanEval/0", "--critical-task", "HumanEval/7",
        "--max-error-rate", "0.1", "--policy-version", "f" * 8,
    ]  # fmt: skip

    assert main(argv) == 0

    assert api.calls("POST", f"{PROJECT}/gates/")[0].json() == {
        "candidate": "abc1234",
        "against": "production",
        "suite": "humaneval",
        "split": "search",
        "epochs": 3,
        "min_score": 0.4,
        "max_regression": 0.05,
        "confidence": 0.9,
        "critical_tasks": ["HumanEval/0", "HumanEval/7"],
        "max_error_rate": 0.1,
        "policy_version": "ffffffff",
    }
    out = capsys.readouterr().out
    assert f"gate {GATE_ID} pending" in out and f"status: {api.url}{GATE_URL}" in out


@pytest.mark.parametrize(
    ("final", "exit_code"),
    [
        (gate_object("finished", "pass"), 0),
        (gate_object("finished", "fail", [reason("min_score", "fail", "mean 0.31 < 0.4.")]), 1),
        (
            gate_object(
                "finished",
                "inconclusive",
                [
                    reason("min_score", "pass", "mean 0.5 ≥ 0.4."),
                    reason("max_regression", "inconclusive", "The delta's CI spans -0.02."),
                ],
            ),
            2,
        ),
        (gate_object("finished", "error", [reason("evaluations", "error", "Baseline failed.")]), 3),
        (gate_object("failed", None), 3),
    ],
)
def test_it_exits_by_the_gates_verdict(api, capsys, final, exit_code):
    gate_created(api)
    api.on("GET", GATE_URL, (200, gate_object("running", None)), (200, final))
    api.on("GET", f"{PROJECT}/evaluations/{CANDIDATE_EVALUATION}/", (200, evaluation("running", 7)))

    assert main([*GATE_ARGS, "--wait", "--interval", "0.01"]) == exit_code

    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0] == f"verdict: {final['verdict'] or 'error'}"
    assert [line.strip() for line in lines[1:-1]] == [
        f"{r['outcome']}: {r['rule']}: {r['message']}" for r in final["reasons"]
    ]
    assert lines[-1] == final["dashboard_url"]
    assert "gate running: candidate 7/40 rollouts, baseline finished" in err


def test_it_prints_only_the_final_gate_as_json(api, capsys):
    gate_created(api)
    final = gate_object(
        "finished", "fail", [reason("critical_tasks", "fail", "HumanEval/7 broke.")]
    )
    api.on(
        "GET",
        GATE_URL,
        (200, gate_object("running", None, evaluation_states=("finished", "finished"))),
        (200, final),
    )

    assert main([*GATE_ARGS, "--wait", "--json"]) == 1

    out, err = capsys.readouterr()
    assert json.loads(out) == final
    assert "gate running" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["gate", "--candidate", "abc1234", "--suite", "humaneval"],
        [*GATE_ARGS, "--min-score", "high"],
        [*GATE_ARGS, "--no-such-flag"],
    ],
)
def test_a_gate_usage_error_exits_3_not_2_which_means_inconclusive(api, argv, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 3
    assert "coevo gate: error:" in capsys.readouterr().err
    assert api.requests == []


def test_a_gate_api_error_exits_3(api, capsys):
    api.on(
        "POST",
        f"{PROJECT}/gates/",
        (404, {"error": {"code": "not_found", "message": "no channel 'production' in demo"}}),
    )

    assert main([*GATE_ARGS, "--wait"]) == 3

    assert capsys.readouterr().err == "coevo: no channel 'production' in demo (not_found)\n"


def test_a_gate_that_outlives_the_timeout_exits_3(api, capsys, monkeypatch):
    gate_created(api)
    api.on("GET", GATE_URL, (200, gate_object("running", None)))
    clock = iter(range(0, 10_000, 100))
    monkeypatch.setattr("coevo.cli.remote.common.monotonic", lambda: next(clock))

    assert main([*GATE_ARGS, "--wait", "--timeout", "150"]) == 3

    assert "(timeout)" in capsys.readouterr().err
