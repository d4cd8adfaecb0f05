"""Query parameters are strict on every list: a malformed ``limit``, ``cursor`` or declared
filter is ``400 invalid_input`` naming the parameter, never a silent fallback to the default.

The lists and their parameters are read from the published schema, so a new list (any GET
whose answer is a ``{next, previous, results}`` page) is covered without being named here."""

from __future__ import annotations

from base64 import b64encode
from typing import Any

import pytest
from drf_spectacular.generators import SchemaGenerator

from coevo.campaigns.services import campaign_create
from coevo.suites.jsonl import scorer_spec_build
from coevo.suites.services import suite_import_jsonl
from tests.api.conftest import assert_error

PAGE = {"next", "previous", "results"}
PAGING = {"limit", "cursor"}


def _list_operations() -> dict[str, tuple[str, list[dict[str, Any]]]]:
    """operationId -> (path, query parameters) of every paginated GET in the schema."""
    schema = SchemaGenerator().get_schema(request=None, public=True)
    components = schema["components"]["schemas"]
    lists = {}
    for path, operations in schema["paths"].items():
        get = operations.get("get")
        if get is None:
            continue
        body = get["responses"].get("200", {}).get("content", {}).get("application/json", {})
        ref = body.get("schema", {}).get("$ref", "")
        properties = components.get(ref.rsplit("/", 1)[-1], {}).get("properties", {})
        if set(properties) == PAGE:
            query = [p for p in get.get("parameters", []) if p["in"] == "query"]
            lists[get["operationId"]] = (path, query)
    return lists


LISTS = _list_operations()


def _malformed(schema: dict[str, Any]) -> list[str]:
    """Values a parameter with this schema must refuse (none for a free-form string)."""
    if "enum" in schema:
        return ["not-a-choice"]
    kind, form = schema.get("type"), schema.get("format")
    if form == "uuid":
        return ["not-a-uuid", "1234"]
    if form in ("date", "date-time"):
        return ["not-a-date", "2026-13-45"]
    if kind == "boolean":
        return ["maybe", "2"]
    if kind in ("integer", "number"):
        return ["abc", "null"]
    values = []
    if "pattern" in schema:
        values.append("!!")
    if "maxLength" in schema:
        values.append("a" * (schema["maxLength"] + 1))
    return values


FILTERS = [
    (operation, parameter["name"], value)
    for operation, (_, query) in sorted(LISTS.items())
    for parameter in query
    if parameter["name"] not in PAGING
    for value in _malformed(parameter["schema"])
]


@pytest.fixture
def call(request, make_client, owner, project):
    """``call(operation, params)``: GET the list as the project's owner."""
    client = make_client(owner, ["read"])

    def get(operation: str, params: dict[str, str]):
        path, _ = LISTS[operation]
        path = path.replace("{slug}", project.slug)
        if "{campaign_id}" in path:
            # Made only for the lists under a campaign: a campaign needs a seed and a suite.
            campaign = _campaign(
                request.getfixturevalue("seed_candidate"),
                request.getfixturevalue("policy_version"),
            )
            path = path.replace("{campaign_id}", str(campaign.id))
        assert "{" not in path, f"{operation}: give its path parameters a value in this fixture"
        return client.get(path, params)

    return get


def _campaign(seed_candidate, policy_version):
    rows = [(key, split) for split in ("search", "validation") for key in ("t1", "t2")]
    suite, _ = suite_import_jsonl(
        project=seed_candidate.project,
        name="strict",
        data="\n".join(
            f'{{"id": "{key}-{split}", "input": "1", "expected": "1", "split": "{split}"}}'
            for key, split in rows
        ).encode(),
        scorer=scorer_spec_build(kind="exact"),
    )
    return campaign_create(
        project=seed_candidate.project,
        name="strict",
        seed_candidate=seed_candidate,
        policy_version=policy_version,
        suite=suite,
    )


def test_it_finds_every_list_in_the_schema():
    assert {
        "projects_list",
        "candidates_list",
        "suites_list",
        "evaluations_list",
        "campaigns_list",
        "campaigns_proposals",
        "exports_list",
        "gates_list",
        "matrices_list",
        "promotions_list",
        "trainers_list",
        "training_runs_list",
    } <= set(LISTS)
    # Filters declared with a type or bounds, so the malformed-filter test has cases.
    assert {(operation, name) for operation, name, _ in FILTERS} >= {
        ("evaluations_list", "state"),
        ("evaluations_list", "candidate"),
        ("campaigns_proposals", "detail"),
    }


@pytest.mark.parametrize("operation", sorted(LISTS))
def test_the_schema_declares_each_lists_paging_with_its_bounds(operation):
    _, query = LISTS[operation]
    declared = {p["name"]: p["schema"] for p in query}
    assert declared["limit"] == {"type": "integer", "minimum": 1, "maximum": 200}
    assert declared["cursor"]["type"] == "string"


@pytest.mark.parametrize("limit", ["null", "abc", "-1", "0", "1.5", "201", "100000"])
@pytest.mark.parametrize("operation", sorted(LISTS))
def test_it_refuses_a_malformed_limit(call, operation, limit):
    error = assert_error(call(operation, {"limit": limit}), 400, "invalid_input")
    assert set(error["details"]["fields"]) == {"limit"}
    assert error["message"] == "limit: must be a whole number from 1 to 200 (default 50)."


@pytest.mark.parametrize(
    "cursor",
    [
        "not a cursor",
        b64encode(b"o=abc").decode(),
        # Decodes, but its position is no creation time: refused before any query runs.
        b64encode(b"p=yesterday").decode(),
        b64encode(b"r=1&p=2026-13-45").decode(),
    ],
)
@pytest.mark.parametrize("operation", sorted(LISTS))
def test_it_refuses_a_malformed_cursor(call, operation, cursor):
    error = assert_error(call(operation, {"cursor": cursor}), 400, "invalid_input")
    assert set(error["details"]["fields"]) == {"cursor"}
    assert error["message"].startswith("cursor: not a cursor this API gave out")


@pytest.mark.parametrize("operation", sorted(LISTS))
def test_it_pages_within_the_bounds(call, operation):
    for limit in ("1", "200"):
        response = call(operation, {"limit": limit})
        assert response.status_code == 200, response.content[:500]
        body = response.json()
        assert set(body) == PAGE and len(body["results"]) <= int(limit)
    assert call(operation, {}).status_code == 200


@pytest.mark.parametrize(("operation", "name", "value"), FILTERS)
def test_it_refuses_a_malformed_filter(call, operation, name, value):
    error = assert_error(call(operation, {name: value}), 400, "invalid_input")
    assert set(error["details"]["fields"]) == {name}


def _wellformed(schema: dict[str, Any]) -> list[str]:
    if "enum" in schema:
        return [str(value) for value in schema["enum"] if value]
    return ["true", "false"] if schema.get("type") == "boolean" else []


@pytest.mark.parametrize(
    ("operation", "name", "value"),
    [
        (operation, parameter["name"], value)
        for operation, (_, query) in sorted(LISTS.items())
        for parameter in query
        for value in _wellformed(parameter["schema"])
    ],
)
def test_it_accepts_each_declared_choice(call, operation, name, value):
    response = call(operation, {name: value})
    assert response.status_code == 200, response.content[:500]
