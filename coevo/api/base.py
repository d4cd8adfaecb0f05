"""The base API view: scope, project membership and role, body size, then (for requests that
create work) the broker, in that order."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.models import QuerySet
from django.urls import reverse
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from coevo.api.pagination import CreatedCursorPagination, PageIn
from coevo.api.permissions import can_see_heldout, project_for_request
from coevo.enqueue import broker_ensure
from coevo.errors import NotFound, PayloadTooLarge
from coevo.policies.models import PolicyVersion
from coevo.policies.selectors import policy_version_find
from coevo.projects.audience import Audience
from coevo.projects.models import Project, Role

# Room for the multipart envelope and the small form fields around an upload.
_MULTIPART_SLACK = 64 * 1024


class ApiView(APIView):
    #: method -> scope the token needs (GET/HEAD default to "read"; others must be declared).
    required_scopes: dict[str, str] = {}
    #: method -> role the user needs on the project (default viewer).
    required_roles: dict[str, Role] = {}
    #: True for views that take file uploads (their limit is COEVO_API_MAX_UPLOAD_MB).
    accepts_upload = False
    #: Methods that create work for the workers (sent to the broker on commit): refused with
    #: 503 broker_unavailable while the broker does not answer, before anything is written.
    enqueues: frozenset[str] = frozenset()

    project: Project

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # authentication, scope, throttle
        slug = kwargs.get("slug")
        if slug is not None:
            role = self.required_roles.get(request.method, Role.VIEWER)
            self.project = project_for_request(request=request, slug=slug, role=role)
        self._check_body_size(request)
        if request.method in self.enqueues:
            broker_ensure()

    def _check_body_size(self, request: Request) -> None:
        # Refused from the declared length, before a byte of the body is read.
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if self.accepts_upload:
            limit = settings.COEVO_API_MAX_UPLOAD_MB * 1024**2 + _MULTIPART_SLACK
            what = f"Uploads are limited to {settings.COEVO_API_MAX_UPLOAD_MB} MiB"
        else:
            limit = settings.COEVO_API_MAX_JSON_BYTES
            what = f"Request bodies are limited to {limit // 1024} KiB"
        if length > limit:
            raise PayloadTooLarge(f"{what}; this one is {length} bytes.")

    def query(self, parameters: type[serializers.Serializer]) -> dict[str, Any]:
        """The query string read through ``parameters``, the serializer the view's schema
        declares: a malformed value (an unknown choice, a bad UUID or boolean) is
        ``400 invalid_input`` naming the parameter, never ignored."""
        parsed = parameters(data=self.request.query_params)
        parsed.is_valid(raise_exception=True)
        return dict(parsed.validated_data)

    def out(
        self,
        serializer: type[serializers.Serializer],
        instance: Any,
        *,
        many: bool = False,
        **context: Any,
    ) -> Any:
        """``instance`` rendered by its output serializer (the one the schema declares);
        ``context`` is what that serializer reads besides the view."""
        return serializer(
            instance, many=many, context={"request": self.request, "view": self, **context}
        ).data

    def can_see_heldout(self) -> bool:
        return can_see_heldout(request=self.request, project=self.project)

    def audience(self) -> Audience:
        """Who this answer is for: a reviewer's personal token reads held-out results (the
        evaluations and the promotion evidence they ran), every other token is a member's."""
        return Audience.REVIEWER if self.can_see_heldout() else Audience.MEMBER

    def absolute(self, name: str, *args: Any, query: str = "") -> str:
        url = reverse(name, args=args)
        return self.request.build_absolute_uri(f"{url}?{query}" if query else url)


def policy_version_named(value: str | None) -> PolicyVersion | None:
    """The policy version a request names, by name or id (None when it names none): an
    unknown one is 404."""
    if not value:
        return None
    version = policy_version_find(name_or_id=value)
    if version is None:
        raise NotFound(f"No policy version {value!r}.")
    return version


# Lists: cursor pagination parameters (checked by the paginator) and the page shape, for the
# schema.
PAGE_PARAMETERS = [PageIn]
_PAGES: dict[str, type[serializers.Serializer]] = {}


def paginated(item: type[serializers.Serializer]) -> type[serializers.Serializer]:
    """``{next, previous, results: [item]}`` as a named serializer (one per item type)."""
    name = f"Paginated{item.__name__.removesuffix('Out')}List"
    if name not in _PAGES:
        _PAGES[name] = type(
            name,
            (serializers.Serializer,),
            {
                "next": serializers.URLField(allow_null=True),
                "previous": serializers.URLField(allow_null=True),
                "results": item(many=True),
            },
        )
    return _PAGES[name]


def paginate(
    view: ApiView, queryset: QuerySet, out: type[serializers.Serializer], **context: Any
) -> Response:
    """A page of ``queryset``, each row rendered by ``out`` (the item the schema declares)."""
    paginator = CreatedCursorPagination()
    page = paginator.paginate_queryset(queryset, view.request, view=view)
    return paginator.get_paginated_response(view.out(out, page, many=True, **context))
