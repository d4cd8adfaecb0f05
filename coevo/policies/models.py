import uuid

from django.db import models

from coevo.db import TimeStampedModel


class EndpointKind(models.TextChoices):
    VLLM = "vllm", "vLLM"
    LLAMACPP = "llamacpp", "llama.cpp"
    OPENAI_COMPATIBLE = "openai-compatible", "OpenAI-compatible"


class PolicyEndpoint(TimeStampedModel):
    """An OpenAI-compatible server. Workers bound their own concurrency against it."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.SlugField(max_length=64, unique=True)
    base_url = models.URLField(max_length=500)
    kind = models.CharField(max_length=32, choices=EndpointKind.choices)
    max_concurrency = models.PositiveIntegerField(default=1)

    def __str__(self) -> str:
        return f"{self.name} ({self.base_url})"


class PolicyVersion(TimeStampedModel):
    """The model weights that answer: a served model name on an endpoint."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.SlugField(max_length=100, unique=True)
    base_model = models.CharField(max_length=200)
    served_name = models.CharField(max_length=200)
    endpoint = models.ForeignKey(PolicyEndpoint, on_delete=models.PROTECT, related_name="versions")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["endpoint", "served_name"], name="policy_version_unique_served_name"
            ),
        ]

    def __str__(self) -> str:
        return self.name
