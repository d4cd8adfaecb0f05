"""The held-out split is sealed (docs/architecture.md, "The held-out seal"; issues 5 and 34): a
marker string planted in held-out task keys, inputs, answers and traces never appears in an
answer to a member who is not reviewing (a researcher or a viewer on the dashboard, a
researcher's or a reviewer's CI token on the API), nor in what a page's template receives; a
reviewer sees it on the promotion pages only.

Routes are not listed by hand: the walk discovers every URL pattern (django.urls' resolver,
named or not, the API's and the admin's included), fills its parameters with every planted
value of that name, and requests each URL (the API's by GET and POST). A route whose
parameters the planted data cannot fill, or that no fill reaches (every fill answers 404), fails
the walk unless ``UNWALKED`` lists it with the reason: a route added later is walked, or listed
here where a reader sees it, never skipped.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest
from cryptography.fernet import Fernet
from django.contrib.contenttypes.models import ContentType
from django.core.paginator import Page
from django.db.models import Model, QuerySet
from django.http import HttpRequest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, resolve, reverse
from django.utils.regex_helper import normalize
from rest_framework.test import APIClient

from coevo.accounts.models import SCOPES, TokenKind
from coevo.accounts.services import token_create
from coevo.audit.models import Webhook, WebhookDelivery
from coevo.campaigns.services import campaign_create
from coevo.evaluations.models import (
    Evaluation,
    Rollout,
    TraceStep,
)
from coevo.exports.services import trajectory_export_build, trajectory_export_create
from coevo.gates.services import gate_create
from coevo.matrices.services import matrix_create
from coevo.policies.services import policy_endpoint_api_key_set
from coevo.projects.models import Role
from coevo.suites.models import Split, Task
from coevo.training.models import TrainingRun
from coevo.training.trainers import trainer_register
from tests.conftest import PASSWORD
from tests.reviews.conftest import MARKER
from tests.support.factories import (
    add_steps,
    make_evaluation,
    make_jsonl_suite,
    make_member,
    make_rollout,
)
from workers.outcomes import RolloutOutcome

pytestmark = pytest.mark.django_db

# An API key planted on the walked project's policy endpoint (coevo/policies/secrets.py).
API_KEY = "sk-walked-1f3a9c0e7b5d4e2a8c6f0b1d3e5a7c9f"

# Routes the walk does not reach with the planted data, each with why that is safe. Keyed by
# route name, or by the route itself where it has none.
UNWALKED = {
    # The API's catch-all: any other path under /api/v1/ is a JSON 404 (coevo/api/urls.py);
    # it reads nothing.
    "api/v1/.*$": "the API's 404 for unknown paths",
    # The admin's catch-all: an unknown admin path, redirected to the admin's login for a
    # member (none is staff) or 404; it reads nothing.
    "admin/(?P<url>.*)$": "the admin's 404 for unknown paths",
    # Staff only (an operator's view of queues and workers): 404 to any member, like a page
    # that does not exist.
    "ops:system": "staff only",
    # The whole log is on the training worker's disk, never on this machine in a test: the
    # run's page (walked) shows its last part.
    "web:training_run_log": "no training log on this machine",
}


@pytest.fixture
def leaky_suite(project):
    rows = [
        {"id": "s1", "input": "1 + 1 =", "expected": "2", "split": "search"},
        {"id": "v1", "input": "2 + 2 =", "expected": "4", "split": "validation"},
        {"id": "h1", "input": f"{MARKER} 3 + 3 =", "expected": f"6 {MARKER}", "split": "heldout"},
        {"id": "h2", "input": f"{MARKER} 4 + 4 =", "expected": f"8 {MARKER}", "split": "heldout"},
    ]
    return make_jsonl_suite(project, rows, name="leaky")


def _evaluation(candidate, suite, policy_version, split: str) -> Evaluation:
    """Every task of ``split`` failed, each trace naming the task's input (and a held-out
    rollout's detail and answer, the marker)."""
    evaluation = make_evaluation(
        candidate=candidate, suite=suite, policy_version=policy_version, split=split, seed=7
    )
    heldout = split == Split.HELDOUT
    for task in Task.objects.filter(suite=suite, split=split):
        rollout = make_rollout(
            evaluation,
            task,
            outcome=RolloutOutcome.TASK_FAILURE,
            score=0.0,
            detail=f"wrong: {MARKER}" if heldout else "wrong",
        )
        Rollout.objects.filter(id=rollout.id).update(
            answer={"text": f"7 {MARKER}" if heldout else "7"}
        )
        prompt = json.dumps(task.inputs)
        # Steps only: make_rollout would count these calls (and want their token counts).
        add_steps(
            rollout,
            [
                ("model_call", {"api": "completions", "prompt": prompt, "completion": "7"}, {}),
                ("log", {"message": f"thinking about {prompt}"}, {}),
            ],
        )
    return evaluation


@pytest.fixture
def planted(
    project,
    owner,
    seed_candidate,
    leaky_suite,
    policy_version,
    marked_promotion,
    settings,
    tmp_path,
) -> dict[str, Any]:
    """Held-out and search evaluations of the leaky suite, the marked promotion request, and
    one of everything else a route names (a campaign, a gate, a matrix, a built export, a
    training run, a webhook and its delivery) on the same project."""
    heldout = _evaluation(seed_candidate, leaky_suite, policy_version, Split.HELDOUT)
    search = _evaluation(seed_candidate, leaky_suite, policy_version, Split.SEARCH)
    # The policy endpoint's API key: a secret no member may read either (its pages show only
    # whether one is set).
    settings.COEVO_SECRETS_KEY = Fernet.generate_key().decode()
    policy_endpoint_api_key_set(endpoint=policy_version.endpoint, api_key=API_KEY, actor=owner)
    rollout = heldout.rollouts.first()
    assert MARKER in json.dumps(
        list(TraceStep.objects.filter(rollout=rollout).values_list("payload", flat=True))
    )
    campaign = campaign_create(
        project=project,
        name="walked",
        seed_candidate=seed_candidate,
        policy_version=policy_version,
        suite=leaky_suite,
    )
    gate = gate_create(
        project=project,
        candidate=marked_promotion.candidate,
        against="production",
        suite=leaky_suite,
        policy_version=policy_version,
        max_regression=0.1,
    )
    matrix = matrix_create(
        project=project,
        candidates=[seed_candidate],
        policy_versions=[policy_version],
        suite=leaky_suite,
        split=Split.SEARCH,
        created_by=owner,
    )
    settings.COEVO_EXPORT_DIR = str(tmp_path / "exports")
    export = trajectory_export_create(project=project, format="chat", created_by=owner)
    assert trajectory_export_build(export_id=export.id) is not None
    run = TrainingRun.objects.create(
        project=project,
        trainer=trainer_register(name="walked-lora", command=["true"], time_limit_s=60),
        export=export,
        parent_policy=policy_version,
        time_limit_s=60,
        created_by=owner,
    )
    webhook = Webhook.objects.create(
        project=project, url="https://hooks.example.com/coevo", secret="s", events=["*"]
    )
    delivery = WebhookDelivery.objects.create(webhook=webhook, event="channel.moved", payload={})
    return {
        # Every value a route's parameter of that name is filled with, in turn.
        "values": {
            "slug": [project.slug],
            "sha": [seed_candidate.sha],
            "path": ["agent.py"],
            "suite_id": [leaky_suite.id],
            "evaluation_id": [heldout.id, search.id],
            # A held-out and a search rollout, and the promotion's flipped tasks' (which only
            # its reviewers open, on its own path).
            "rollout_id": [
                rollout.id,
                search.rollouts.first().id,
                *(
                    row[side]
                    for row in marked_promotion.evidence["comparison"]["flipped_tasks"]
                    for side in ("candidate_rollout", "reference_rollout")
                ),
            ],
            # A channel's name, a suite's name.
            "name": ["production", leaky_suite.name],
            "request_id": [marked_promotion.id],
            "campaign_id": [campaign.id],
            "gate_id": [gate.id],
            "matrix_id": [matrix.id],
            "export_id": [export.id],
            "run_id": [run.id],
            "webhook_id": [webhook.id],
            "delivery_id": [delivery.id],
            # The POST-only actions of pages (GET answers 405).
            "action": ["cancel"],
            # The admin's (every member is refused it).
            "app_label": ["evaluations"],
            "object_id": [rollout.id],
            "content_type_id": [ContentType.objects.get_for_model(Rollout).id],
            "id": [rollout.id],
        },
        # Query strings a route needs to reach its content, by route.
        "queries": {
            "web:comparison": [
                f"?reference={search.id}&candidate={search.id}",
                f"?reference={search.id}&candidate={heldout.id}",
                f"?reference={heldout.id}&candidate={heldout.id}",
            ],
            # A search that matches the held-out traces (and echoes the query, not the marker).
            "web:rollout": ["?q=heldout-marker"],
            "web:suite": ["?split=heldout"],
        },
        "rollout_id": rollout.id,
        "search_evaluation": search,
        "heldout_evaluation": heldout,
        "promotion": marked_promotion,
    }


@dataclasses.dataclass(frozen=True)
class Route:
    key: str  # its name ("web:rollout"), or the route itself where it has none
    route: str  # as ResolverMatch.route spells it
    parts: tuple[Any, ...]  # its patterns, outermost first

    @property
    def params(self) -> list[str]:
        return [p for part in self.parts for p in part.regex.groupindex]


def _routes(resolver: URLResolver | None = None, parts=(), namespace: str = "") -> list[Route]:
    """Every URL pattern the project serves, named or not."""
    found = []
    for pattern in (resolver or get_resolver()).url_patterns:
        if isinstance(pattern, URLResolver):
            inner = f"{namespace}{pattern.namespace}:" if pattern.namespace else namespace
            found += _routes(pattern, (*parts, pattern.pattern), inner)
        elif isinstance(pattern, URLPattern):
            chain = (*parts, pattern.pattern)
            # As ResolverMatch.route joins them: a regex's leading "^" dropped.
            route = "".join(str(part).removeprefix("^") for part in chain)
            key = f"{namespace}{pattern.name}" if pattern.name else route
            found.append(Route(key, route, chain))
    return found


def _fills(route: Route, values: dict[str, list[Any]]) -> Iterator[str]:
    """The route's URL with each combination of planted values for its parameters (nothing
    when a parameter has none), each one checked to resolve to this route."""
    params = route.params
    if not set(params) <= set(values):
        return
    for combination in itertools.product(*(values[p] for p in params)):
        filled = dict(zip(params, (str(value) for value in combination), strict=True))
        path = ""
        for part in route.parts:
            text, _ = normalize(part.regex.pattern)[0]
            path += text % filled
        url = f"/{path}"
        try:
            match = resolve(url)
        except Exception:  # noqa: BLE001 - a fill this route does not accept
            continue
        if match.route == route.route:
            yield url


def _walk(
    client, values: dict[str, list[Any]], *, api: bool, queries: dict[str, list[str]]
) -> dict[str, Any]:
    """Request every URL of every route (the API's, or every other), bare and with each of
    its ``queries``; a route that no fill reaches (nothing to fill it with, or 404 for every
    fill) fails unless UNWALKED lists it. Returns the responses by method and URL."""
    responses: dict[str, Any] = {}
    missed = []
    for route in _routes():
        if route.route.startswith("api/") != api:
            continue
        reached = False
        filled = [
            url + query
            for url in _fills(route, values)
            for query in ("", *queries.get(route.key, ()))
        ]
        for url in filled:
            for method in ("get", "post") if api else ("get",):
                response = getattr(client, method)(url)
                responses[f"{method.upper()} {url}"] = response
                reached = reached or response.status_code != 404
        if not reached and route.key not in UNWALKED:
            missed.append(route.key)
    assert not missed, (
        f"No planted value reaches these routes: plant one (planted()) or list the route in "
        f"UNWALKED with why it cannot leak: {missed}"
    )
    assert set(UNWALKED) <= {route.key for route in _routes()}, "UNWALKED names no route"
    return responses


def _carries(value: Any, text: str, seen: set[int] | None = None, depth: int = 0) -> bool:
    """Whether ``text`` is anywhere in ``value``, a template context's value: strings, maps,
    sequences, dataclasses, model rows (their loaded fields and related rows), query sets
    already read and pages. The request itself is left out (it echoes the URL)."""
    seen = set() if seen is None else seen
    if depth > 12 or id(value) in seen or isinstance(value, HttpRequest):
        return False
    seen.add(id(value))
    nested: list[Any]
    if isinstance(value, str | bytes):
        return text in (value if isinstance(value, str) else value.decode(errors="replace"))
    if isinstance(value, dict):
        nested = [*value.keys(), *value.values()]
    elif isinstance(value, list | tuple | set | frozenset):
        nested = list(value)
    elif isinstance(value, Page):
        nested = list(value.object_list)
    elif isinstance(value, QuerySet):
        nested = list(value._result_cache or ())
    elif isinstance(value, Model):
        nested = [v for k, v in vars(value).items() if k != "_state"]
        nested += list(value._state.fields_cache.values())
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        nested = [getattr(value, f.name) for f in dataclasses.fields(value)]
    else:
        return False
    return any(_carries(item, text, seen, depth + 1) for item in nested)


def _template_context_carries(response, text: str) -> bool:
    contexts = response.context
    if contexts is None:
        return False
    contexts = contexts if isinstance(contexts, list) else [contexts]
    return any(_carries(context.flatten(), text) for context in contexts)


def _promotion_rollout_urls(promotion) -> list[str]:
    """The reviewer path to each flipped task's two traces."""
    slug = promotion.project.slug
    return [
        reverse("web:promotion_rollout", args=[slug, promotion.id, row[side]])
        for row in promotion.evidence["comparison"]["flipped_tasks"]
        for side in ("candidate_rollout", "reference_rollout")
    ]


def _login(user) -> Client:
    client = Client()
    assert client.login(username=user.get_username(), password=PASSWORD)
    return client


def _api(user, kind: str) -> APIClient:
    scopes = [s for s in SCOPES if s != "promotions:approve"]
    _, raw = token_create(user=user, name="leak", kind=kind, scopes=scopes, created_by=user)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def _with_token(values: dict[str, list[Any]], user) -> dict[str, list[Any]]:
    """The planted values and a token of ``user``'s own (the token pages name one)."""
    token, _ = token_create(
        user=user, name="walked", kind=TokenKind.PERSONAL, scopes=["read"], created_by=user
    )
    return {**values, "token_id": [token.id]}


@pytest.mark.parametrize("role", [Role.RESEARCHER, Role.VIEWER])
def test_it_never_shows_heldout_inputs_or_traces_on_a_dashboard_page(project, planted, role):
    """Every page (every route outside the API) as a member who is not a reviewer: no marker
    in the answer, nor in what its template received; nor the policy endpoint's API key."""
    member = make_member(project, f"u-{role.value}", role)
    client = _login(member)
    responses = _walk(
        client, _with_token(planted["values"], member), api=False, queries=planted["queries"]
    )
    assert len(responses) >= 100, sorted(responses)  # the walk found the pages
    for url, response in responses.items():
        assert response.status_code < 500, url
        body = b"".join(response) if response.streaming else response.content
        for secret in (MARKER, API_KEY):
            assert secret not in body.decode(errors="replace"), url
            assert not _template_context_carries(response, secret), url


@pytest.mark.parametrize("who", ["researcher", "reviewer-ci"])
def test_it_never_returns_heldout_inputs_or_traces_to_a_non_reviewer_token(
    project, planted, reviewer, who
):
    """Every API route, by GET and POST, with a token that may not see held-out results: no
    marker, nor the policy endpoint's API key."""
    if who == "researcher":
        user = make_member(project, "r-api", Role.RESEARCHER)
        client = _api(user, TokenKind.PERSONAL)
    else:
        user = reviewer
        client = _api(reviewer, TokenKind.CI)
    responses = _walk(
        client, _with_token(planted["values"], user), api=True, queries=planted["queries"]
    )
    assert len(responses) >= 80, sorted(responses)
    for url, response in responses.items():
        assert response.status_code < 500, url
        body = b"".join(response) if response.streaming else response.content
        assert MARKER not in body.decode(errors="replace"), url
        assert API_KEY not in body.decode(errors="replace"), url


def test_a_route_the_planted_data_cannot_reach_fails_the_walk(project, planted):
    """The walk's own guarantee: without a planted value for a route's parameter, that route
    fails the walk instead of being skipped."""
    member = make_member(project, "u-missing", Role.VIEWER)
    values = {k: v for k, v in _with_token(planted["values"], member).items() if k != "gate_id"}
    with pytest.raises(AssertionError, match="web:gate"):
        _walk(_login(member), values, api=False, queries={})


def test_the_reviewer_rollout_path_is_refused_to_a_researcher_and_to_foreign_rollouts(
    project, planted, reviewer
):
    """The promotion path unseals a rollout only for reviewers and only for the request's
    own evaluations; a made-up request id is a 404 either way."""
    import uuid

    url = reverse("web:promotion_rollout", args=[project.slug, uuid.uuid4(), planted["rollout_id"]])
    researcher = _login(make_member(project, "r-web", Role.RESEARCHER))
    assert researcher.get(url).status_code == 403
    response = _login(reviewer).get(url)
    assert response.status_code == 404
    assert MARKER not in response.content.decode()


def test_the_held_out_rollout_page_is_not_found_even_for_a_reviewer(project, planted, reviewer):
    """Outside its promotion request a held-out rollout is not found: its outcome, score and
    detail are held-out results as much as its trace is."""
    response = _login(reviewer).get(
        reverse("web:rollout", args=[project.slug, planted["rollout_id"]])
    )
    assert response.status_code == 404
    assert MARKER not in response.content.decode()


def test_a_reviewer_sees_heldout_details_on_the_promotion_pages_and_nowhere_else(
    project, planted, reviewer
):
    client = _login(reviewer)
    promotion = planted["promotion"]
    responses = _walk(
        client, _with_token(planted["values"], reviewer), api=False, queries=planted["queries"]
    )
    shown = set()
    for url, response in responses.items():
        assert response.status_code < 500, url
        body = b"".join(response) if response.streaming else response.content
        if MARKER in body.decode(errors="replace"):
            shown.add(url.removeprefix("GET "))
    # The request page (its flipped task) and the reviewer path to that task's two traces.
    assert shown == {
        reverse("web:promotion", args=[project.slug, promotion.id]),
        *_promotion_rollout_urls(promotion),
    }


def test_a_reviewers_personal_token_reads_the_flipped_heldout_tasks(project, planted, reviewer):
    _, raw = token_create(
        user=reviewer, name="mine", kind=TokenKind.PERSONAL, scopes=["read"], created_by=reviewer
    )
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    response = client.get(reverse("api:promotion", args=[project.slug, planted["promotion"].id]))
    assert response.status_code == 200
    assert response.json()["evidence"]["comparison"]["flips"]["fixed"] == [f"h1-{MARKER}"]
