import uuid

from django.conf import settings
from django.db import models

from coevo.db import TimeStampedModel

# What a token may be allowed to do (docs/api.md, "Authentication and scopes"). A token acts
# with its user's project roles and never beyond these.
SCOPES = (
    "read",
    "candidates:write",
    "suites:write",
    "evaluations:run",
    "campaigns:run",
    "promotions:request",
    "promotions:approve",
)
# Scopes only a person may hold: approving is a human decision, never a pipeline's.
PERSONAL_ONLY_SCOPES = ("promotions:approve",)

TOKEN_PREFIX_LENGTH = 8


class TokenKind(models.TextChoices):
    PERSONAL = "personal"
    CI = "ci", "CI"


class ApiToken(TimeStampedModel):
    """A bearer token: ``coevo_<prefix>_<secret>``. Only the prefix (for lookup) is stored in
    clear; the whole token is stored as its SHA-256, so a database leak yields no usable token."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=16, choices=TokenKind.choices, default=TokenKind.PERSONAL)
    prefix = models.CharField(max_length=TOKEN_PREFIX_LENGTH, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    scopes = models.JSONField(default=list)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # The unique index is also the lookup index of token_authenticate.
            models.UniqueConstraint(fields=["prefix"], name="api_token_unique_prefix"),
            models.CheckConstraint(
                condition=models.Q(kind__in=["personal", "ci"]), name="api_token_kind_valid"
            ),
            models.CheckConstraint(condition=~models.Q(name=""), name="api_token_name_not_empty"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None
