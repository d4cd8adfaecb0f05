from __future__ import annotations

from coevo.projects.services import project_get_or_create


def test_it_lists_the_token_users_projects_with_their_role(make_client, researcher, project):
    project_get_or_create(slug="other", name="Not theirs")
    response = make_client(researcher, ["read"]).get("/api/v1/projects/")
    assert response.status_code == 200
    body = response.json()
    assert [p["slug"] for p in body["results"]] == ["demo"]
    assert body["results"][0]["role"] == "researcher"
    assert body["results"][0]["url"].endswith("/api/v1/projects/demo/")
    assert body["next"] is None


def test_it_pages_with_a_cursor(make_client, owner, project):
    from coevo.projects.models import Role
    from coevo.projects.services import membership_set

    for i in range(4):
        membership_set(
            project=project_get_or_create(slug=f"p{i}", name=f"P{i}"), user=owner, role=Role.VIEWER
        )
    client = make_client(owner, ["read"])
    first = client.get("/api/v1/projects/?limit=2").json()
    assert len(first["results"]) == 2 and first["next"]
    second = client.get(first["next"]).json()
    third = client.get(second["next"]).json()
    slugs = [p["slug"] for page in (first, second, third) for p in page["results"]]
    assert sorted(slugs) == ["demo", "p0", "p1", "p2", "p3"]
    assert third["next"] is None


def test_it_gets_one_project(make_client, owner, project):
    body = make_client(owner, ["read"]).get("/api/v1/projects/demo/").json()
    assert body["slug"] == "demo" and body["role"] == "admin"
