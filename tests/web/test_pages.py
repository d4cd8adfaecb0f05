"""The dashboard's pages, through Django's test client."""

from __future__ import annotations

import html
import re

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from coevo.evaluations.models import EvaluationState, Rollout, RolloutState
from coevo.projects.models import Role
from coevo.projects.services import membership_set, project_get_or_create
from coevo.suites.models import Task
from coevo.web.highlight import CSS_PATH, pygments_css
from tests.web.conftest import (
    CHILD_MARKER,
    COMPLETION,
    CRASH,
    INVALID_HARNESS,
    TRACEBACK,
    finish_rollout,
)

pytestmark = pytest.mark.django_db


def text(response) -> str:
    return html.unescape(response.content.decode())


def plain(response) -> str:
    """The page's visible text, whitespace collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", response.content.decode())).split())


def page_urls(project, candidate, data) -> list[str]:
    slug, sha = project.slug, candidate.sha
    return [
        reverse("web:project", args=[slug]),
        reverse("web:candidate", args=[slug, sha]),
        reverse("web:candidate_file", args=[slug, sha, "agent.py"]),
        reverse("web:candidate_diff", args=[slug, sha]),
        reverse("web:evaluation", args=[slug, data.evaluation.id]),
        reverse("web:rollout", args=[slug, data.passed.id]),
    ]


# --- access ----------------------------------------------------------------------------------


def test_it_answers_404_to_an_outsider_on_every_project_page(
    client, outsider, project, seed_candidate, finished_evaluation
):
    client.force_login(outsider)
    for url in page_urls(project, seed_candidate, finished_evaluation):
        response = client.get(url)
        assert response.status_code == 404, url
        assert seed_candidate.short_sha not in response.content.decode()


def test_it_answers_404_to_an_outsider_polling_the_evaluation(
    client, outsider, project, running_evaluation
):
    client.force_login(outsider)
    url = reverse("web:evaluation", args=[project.slug, running_evaluation.evaluation.id])
    assert client.get(url, headers={"HX-Request": "true"}).status_code == 404


def test_it_sends_a_poll_after_the_session_expired_to_the_login_page(
    client, project, running_evaluation
):
    url = reverse("web:evaluation", args=[project.slug, running_evaluation.evaluation.id])

    response = client.get(url, headers={"HX-Request": "true"})

    assert response.status_code == 204
    assert response["HX-Redirect"] == f"{reverse('login')}?next={url}"


def test_it_redirects_anonymous_visitors_to_the_login_page(
    client, project, seed_candidate, finished_evaluation
):
    urls = [reverse("web:home"), *page_urls(project, seed_candidate, finished_evaluation)]
    for url in urls:
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith(reverse("login") + "?next="), url


def test_it_does_not_show_one_projects_rows_under_another_projects_slug(
    client, owner, project, seed_candidate, finished_evaluation
):
    other = project_get_or_create(slug="other", name="Other agent")
    membership_set(project=other, user=owner, role=Role.ADMIN)
    client.force_login(owner)
    for url in page_urls(project, seed_candidate, finished_evaluation)[1:]:
        moved = url.replace(f"/p/{project.slug}/", "/p/other/")
        assert client.get(moved).status_code == 404, moved


def test_it_lets_staff_see_every_project(client, project, seed_candidate):
    staff = get_user_model().objects.create_user("staff", password="x", is_staff=True)
    client.force_login(staff)
    assert client.get(reverse("web:project", args=[project.slug])).status_code == 200


def test_it_logs_in_through_the_login_form(client, owner, project):
    from tests.conftest import PASSWORD

    page = client.get(reverse("login"))
    assert page.status_code == 200
    assert 'name="username"' in page.content.decode()
    response = client.post(
        reverse("login"), {"username": "owner", "password": PASSWORD}, follow=True
    )
    assert response.redirect_chain[-1][0] == reverse("web:home")
    assert "Demo agent" in text(response)


def test_it_logs_out_with_a_post_form(client, owner, project):
    client.force_login(owner)
    page = text(client.get(reverse("web:home")))
    assert f'action="{reverse("logout")}"' in page
    assert 'name="csrfmiddlewaretoken"' in page
    client.post(reverse("logout"))
    assert client.get(reverse("web:home")).status_code == 302


# --- home and project ------------------------------------------------------------------------


def test_it_lists_only_the_users_projects_on_home(client, owner, outsider, project):
    project_get_or_create(slug="secret", name="Secret agent")
    client.force_login(owner)
    page = text(client.get(reverse("web:home")))
    assert "Demo agent" in page
    assert "Secret agent" not in page
    assert 'hx-headers=\'{"X-CSRFToken": "' in client.get(reverse("web:home")).content.decode()

    client.force_login(outsider)
    page = text(client.get(reverse("web:home")))
    assert "Demo agent" not in page
    assert "not a member of any project" in page


def test_it_shows_candidates_suites_and_evaluations_on_the_project_page(
    client, reviewer, project, seed_candidate, clamped_child, finished_evaluation
):
    client.force_login(reviewer)
    response = client.get(reverse("web:project", args=[project.slug]))
    assert response.status_code == 200
    page = text(response)
    candidate_url = reverse("web:candidate", args=[project.slug, clamped_child.sha])
    assert f'href="{candidate_url}"' in page
    assert clamped_child.short_sha in page
    assert "Clamp samples to at least one" in page
    assert "Proposer" in page
    # The child's parent column links to the seed.
    assert f'href="{reverse("web:candidate", args=[project.slug, seed_candidate.sha])}"' in page
    assert "humaneval" in page
    evaluation_url = reverse(
        "web:evaluation", args=[project.slug, finished_evaluation.evaluation.id]
    )
    assert f'href="{evaluation_url}"' in page
    assert "finished" in page
    assert "25.0% [4.6%, 69.9%]" in plain(response)
    assert "your role: reviewer" in page


# --- candidates, files, diffs ------------------------------------------------------------------


def test_it_shows_a_candidates_metadata_files_and_evaluations(
    client, owner, project, seed_candidate, clamped_child, finished_evaluation
):
    client.force_login(owner)
    page = text(client.get(reverse("web:candidate", args=[project.slug, clamped_child.sha])))
    assert clamped_child.sha in page
    assert "A proposer's change." in page
    assert reverse("web:candidate", args=[project.slug, seed_candidate.sha]) in page
    for path in ("agent.py", "harness.toml", "logo.png"):
        assert reverse("web:candidate_file", args=[project.slug, clamped_child.sha, path]) in page
    assert reverse("web:candidate_diff", args=[project.slug, clamped_child.sha]) in page
    assert f"diff against parent {seed_candidate.short_sha}" in page

    page = text(client.get(reverse("web:candidate", args=[project.slug, seed_candidate.sha])))
    assert "none (root commit)" in page
    assert "diff against the empty tree" in page
    evaluation_url = reverse(
        "web:evaluation", args=[project.slug, finished_evaluation.evaluation.id]
    )
    assert evaluation_url in page


def test_it_finds_a_candidate_by_sha_prefix(client, owner, project, seed_candidate):
    client.force_login(owner)
    response = client.get(f"/p/{project.slug}/c/{seed_candidate.sha[:8].upper()}/")
    assert response.status_code == 200
    assert seed_candidate.sha in text(response)
    assert client.get(f"/p/{project.slug}/c/{'0' * 40}/").status_code == 404


def test_it_highlights_a_file(client, owner, project, seed_candidate):
    client.force_login(owner)
    url = reverse("web:candidate_file", args=[project.slug, seed_candidate.sha, "agent.py"])
    response = client.get(url)
    assert response.status_code == 200
    body = response.content.decode()
    assert 'class="highlight"' in body
    # Pygments' Python lexer marks keywords and function names.
    assert '<span class="k">def</span><span class="w"> </span><span class="nf">run</span>' in body
    assert "/static/pygments.css" in body


def test_it_says_a_binary_file_is_binary(client, owner, project, clamped_child):
    client.force_login(owner)
    url = reverse("web:candidate_file", args=[project.slug, clamped_child.sha, "logo.png"])
    page = text(client.get(url))
    assert "Binary file" in page
    assert "PNG" not in page.split("Binary file", 1)[1]


def test_it_answers_404_for_a_missing_file(client, owner, project, seed_candidate):
    client.force_login(owner)
    url = reverse("web:candidate_file", args=[project.slug, seed_candidate.sha, "nope.py"])
    response = client.get(url)
    assert response.status_code == 404
    assert "No file 'nope.py'" in text(response)


def test_it_diffs_a_candidate_against_its_parent(
    client, owner, project, seed_candidate, clamped_child
):
    client.force_login(owner)
    page = text(client.get(reverse("web:candidate_diff", args=[project.slug, clamped_child.sha])))
    assert 'class="highlight"' in page
    # DiffLexer: removed lines are Generic.Deleted (gd), added lines Generic.Inserted (gi).
    assert '<span class="gd">-    samples = knobs["samples"]</span>' in page
    assert (
        f'<span class="gi">+    samples = max(1, knobs["samples"])  {CHILD_MARKER}</span>' in page
    )
    assert "logo.png" in page
    assert "harness.toml" not in page  # unchanged
    assert "(its parent)" in page


def test_it_diffs_a_root_candidate_against_the_empty_tree(client, owner, project, seed_candidate):
    client.force_login(owner)
    page = text(client.get(reverse("web:candidate_diff", args=[project.slug, seed_candidate.sha])))
    assert "against the empty tree" in page
    assert "+def run(task, ctx):" in page
    assert '+name = "humaneval-basic"' in page


def test_it_diffs_against_another_base_given_in_the_query(
    client, owner, project, seed_candidate, clamped_child
):
    client.force_login(owner)
    url = reverse("web:candidate_diff", args=[project.slug, seed_candidate.sha])
    page = text(client.get(url, {"base": clamped_child.sha[:10]}))
    # Reversed direction: the child's line is removed.
    assert f'-    samples = max(1, knobs["samples"])  {CHILD_MARKER}' in page
    assert client.get(url, {"base": "feedbeef"}).status_code == 404


# --- evaluations -------------------------------------------------------------------------------


def test_it_shows_an_evaluation_with_its_score_interval_and_rows(
    client, owner, project, finished_evaluation
):
    client.force_login(owner)
    data = finished_evaluation
    response = client.get(reverse("web:evaluation", args=[project.slug, data.evaluation.id]))
    assert response.status_code == 200
    page = text(response)
    assert data.evaluation.candidate.short_sha in page
    assert "humaneval" in page and "search" in page
    assert data.evaluation.policy_version.name in page
    # 1 passed out of 4 scored rollouts, with the 95% Wilson interval.
    assert "pass rate 25.0% [4.6%, 69.9%] over 4 tasks" in plain(response)
    assert "95% Wilson score interval" in page
    assert "4/4" in page
    for rollout in (data.passed, data.failed, data.invalid, data.crashed):
        assert reverse("web:rollout", args=[project.slug, rollout.id]) in page
        assert rollout.task.key in page
    assert INVALID_HARNESS in page
    assert "harness error" in page
    assert "task failure" in page
    assert "450 ms" in page
    # Prompt + completion tokens of the passed rollout's one model call.
    assert ">150<" in page.replace(" ", "")


def test_it_polls_the_progress_while_the_evaluation_runs(
    client, owner, project, running_evaluation
):
    client.force_login(owner)
    url = reverse("web:evaluation", args=[project.slug, running_evaluation.evaluation.id])

    full = client.get(url)
    assert "<html" in full.content.decode()
    assert 'hx-trigger="every 2s"' in full.content.decode()

    partial = client.get(url, headers={"HX-Request": "true"})
    body = partial.content.decode()
    assert partial.status_code == 200
    assert "<html" not in body
    assert body.lstrip().startswith('<section id="evaluation-progress"')
    assert 'hx-trigger="every 2s"' in body
    assert f'hx-get="{url}"' in body
    assert 'hx-swap="outerHTML"' in body
    assert "4/6" in body
    assert "HX-Request" in partial["Vary"]


def test_it_stops_polling_once_the_evaluation_is_final(client, owner, project, running_evaluation):
    client.force_login(owner)
    data = running_evaluation
    for rollout in data.unfinished:
        finish_rollout(rollout)
    data.evaluation.state = EvaluationState.FINISHED
    data.evaluation.save(update_fields=["state"])
    url = reverse("web:evaluation", args=[project.slug, data.evaluation.id])

    for response in (client.get(url, headers={"HX-Request": "true"}), client.get(url)):
        body = response.content.decode()
        assert "hx-trigger" not in body
        assert "6/6" in body
        assert "50.0%" in body


def test_it_shows_running_and_pending_rollouts_as_such(client, owner, project, running_evaluation):
    client.force_login(owner)
    url = reverse("web:evaluation", args=[project.slug, running_evaluation.evaluation.id])
    page = client.get(url, headers={"HX-Request": "true"}).content.decode()
    assert '<span class="badge state-running">running</span>' in page
    assert '<span class="badge state-pending">pending</span>' in page


# --- rollouts ------------------------------------------------------------------------------------


def test_it_shows_a_rollouts_prompt_and_model_calls(client, owner, project, finished_evaluation):
    client.force_login(owner)
    rollout = finished_evaluation.passed
    response = client.get(reverse("web:rollout", args=[project.slug, rollout.id]))
    assert response.status_code == 200
    page = text(response)
    prompt = rollout.task.inputs["prompt"]
    assert rollout.task.key in page
    # The task prompt once, and again as the model call's prompt.
    assert page.count(prompt) == 2
    assert COMPLETION in page
    assert "120 prompt tokens" in page
    assert "30 completion tokens" in page
    assert "450 ms" in page
    assert "temperature=0.0" in page and "max_tokens=192" in page
    assert 'stop=["\\ndef "]' in page
    assert "kept the first sample" in page
    assert "passed" in page


def test_it_shows_the_verdict_of_a_failed_rollout(client, owner, project, finished_evaluation):
    client.force_login(owner)
    page = text(
        client.get(reverse("web:rollout", args=[project.slug, finished_evaluation.failed.id]))
    )
    assert "failed: AssertionError" in page
    assert "verifier-output-marker" in page


def test_it_puts_a_harness_errors_reason_up_front(client, owner, project, finished_evaluation):
    client.force_login(owner)
    page = text(
        client.get(reverse("web:rollout", args=[project.slug, finished_evaluation.invalid.id]))
    )
    reason = page.index('id="rollout-detail"')
    assert page.index(INVALID_HARNESS) > reason
    assert page.index(INVALID_HARNESS) < page.index("Task prompt")


def test_it_shows_a_harness_exceptions_traceback_and_stderr(
    client, owner, project, finished_evaluation
):
    client.force_login(owner)
    page = text(
        client.get(reverse("web:rollout", args=[project.slug, finished_evaluation.crashed.id]))
    )
    assert CRASH in page
    assert TRACEBACK in page
    assert "stderr-marker" in page


def test_it_never_shows_the_tasks_hidden_tests(client, owner, project, finished_evaluation):
    client.force_login(owner)
    for rollout in (finished_evaluation.passed, finished_evaluation.failed):
        hidden = Task.objects.get(id=rollout.task_id).verifier["test"]
        assert "def check(candidate)" in hidden
        page = text(client.get(reverse("web:rollout", args=[project.slug, rollout.id])))
        assert hidden not in page
        assert "def check(candidate)" not in page


def test_it_escapes_model_output(client, owner, project, finished_evaluation):
    client.force_login(owner)
    rollout = finished_evaluation.passed
    step = rollout.steps.get(kind="model_call")
    step.payload["completion"] = "<script>alert('pwned')</script>"
    step.save()
    body = client.get(reverse("web:rollout", args=[project.slug, rollout.id])).content.decode()
    assert "<script>alert" not in body
    assert "&lt;script&gt;alert" in body


def test_it_shows_a_pending_rollout_without_a_trace(client, owner, project, running_evaluation):
    client.force_login(owner)
    pending = Rollout.objects.get(
        evaluation=running_evaluation.evaluation, state=RolloutState.PENDING
    )
    page = text(client.get(reverse("web:rollout", args=[project.slug, pending.id])))
    assert "No trace recorded yet." in page


# --- assets ---------------------------------------------------------------------------------------


def test_it_ships_the_pygments_stylesheet_of_the_installed_pygments():
    assert CSS_PATH.read_text() == pygments_css(), "run: python -m coevo.web.highlight"
