import uuid

from django.db import models
from django.db.models import F, Q

from coevo.db import TimeStampedModel


class EndpointKind(models.TextChoices):
    """What serves an endpoint, which decides what its requests carry (one table per kind:
    coevo/policies/request_tables.py) and how its API key is sent."""

    VLLM = "vllm", "vLLM"
    LLAMACPP = "llamacpp", "llama.cpp"
    # Any server that speaks OpenAI's API: a hosted provider (OpenRouter, Together, Fireworks),
    # a company gateway, a server of another make.
    OPENAI_COMPATIBLE = "openai-compatible", "OpenAI-compatible"
    OPENAI = "openai", "OpenAI API"
    # Anthropic's native Messages API (POST /v1/messages).
    ANTHROPIC = "anthropic", "Anthropic API"


# The endpoint kinds that load a trained LoRA adapter at run time (vLLM's runtime-LoRA API):
# vLLM started with --enable-lora, and coevo's llama.cpp host (the adapter converted to GGUF).
ADAPTER_ENDPOINT_KINDS = (EndpointKind.VLLM, EndpointKind.LLAMACPP)


class PolicyEndpoint(TimeStampedModel):
    """An OpenAI-compatible server. Workers bound their own concurrency against it.

    Health is written by the beat job ``policy_endpoints_check`` (and by workers when a request
    cannot connect, or gets an error status and then the same health probe fails; never for the
    status one request got while the probe answers): an unhealthy endpoint receives no rollouts. A new endpoint counts as healthy
    until its first check, so nothing waits for beat before the first evaluation.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.SlugField(max_length=64, unique=True)
    base_url = models.URLField(max_length=500)
    kind = models.CharField(max_length=32, choices=EndpointKind.choices)
    max_concurrency = models.PositiveIntegerField(default=1)
    healthy = models.BooleanField(default=True)
    checked_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    latency_ms = models.PositiveIntegerField(null=True, blank=True)
    consecutive_failures = models.PositiveIntegerField(default=0)
    # When it last failed (None: never), for operators; routing is round robin among the healthy.
    failed_at = models.DateTimeField(null=True, blank=True)
    # The API key, as a Fernet token made with COEVO_SECRETS_KEY (coevo/policies/secrets.py);
    # "" for none. Written only by policy_endpoint_api_key_set/_revoke, never shown.
    api_key_encrypted = models.TextField(blank=True, default="", editable=False)
    api_key_set_at = models.DateTimeField(null=True, blank=True, editable=False)

    def __str__(self) -> str:
        return f"{self.name} ({self.base_url})"

    @property
    def has_api_key(self) -> bool:
        return bool(self.api_key_encrypted)


class PolicyVersion(TimeStampedModel):
    """The model weights that answer: a base model, optionally with a LoRA adapter, served
    under ``served_name`` on its primary ``endpoint`` and any ``replicas``.

    An adapter version is addressed by its adapter name (vLLM's ``lora_name``), so its
    ``served_name`` is the adapter name; ``adapter_path`` is where the *server* reads it.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.SlugField(max_length=100, unique=True)
    base_model = models.CharField(max_length=200)
    served_name = models.CharField(max_length=200)
    endpoint = models.ForeignKey(PolicyEndpoint, on_delete=models.PROTECT, related_name="versions")
    # More servers with the same weights: rollouts are routed to a healthy one.
    replicas = models.ManyToManyField(PolicyEndpoint, blank=True, related_name="replica_versions")
    adapter_name = models.CharField(max_length=200, blank=True, default="")
    adapter_path = models.CharField(max_length=1000, blank=True, default="")
    parent = models.ForeignKey(
        "self", on_delete=models.PROTECT, null=True, blank=True, related_name="children"
    )
    # Where the weights came from: {"export": <id>, "trainer_command": [...], "output_dir": ...,
    # "created_at": ...}; free-form beyond those keys.
    provenance = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["endpoint", "served_name"], name="policy_version_unique_served_name"
            ),
            models.CheckConstraint(
                condition=Q(adapter_name="", adapter_path="")
                | (~Q(adapter_name="") & ~Q(adapter_path="")),
                name="policy_version_adapter_name_and_path_together",
            ),
            models.CheckConstraint(
                condition=Q(adapter_name="") | Q(served_name=F("adapter_name")),
                name="policy_version_adapter_served_by_its_name",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def has_adapter(self) -> bool:
        return bool(self.adapter_name)


class LoadedAdapter(TimeStampedModel):
    """An adapter coevo loaded on a vLLM endpoint (or a llama.cpp one: the coevo llama.cpp host),
    with its last use: the beat job unloads adapters idle longer than COEVO_ADAPTER_IDLE_S (vLLM
    holds at most ``--max-loras``, the host ``--max-adapters``)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    endpoint = models.ForeignKey(PolicyEndpoint, on_delete=models.CASCADE, related_name="adapters")
    adapter_name = models.CharField(max_length=200)
    adapter_path = models.CharField(max_length=1000)
    last_used_at = models.DateTimeField(db_index=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["endpoint", "adapter_name"], name="loaded_adapter_unique_per_endpoint"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.adapter_name} on {self.endpoint.name}"


class ModelPrice(TimeStampedModel):
    """What a model's tokens cost on an endpoint, in US dollars per million tokens, from
    ``effective_from`` on (coevo/policies/prices.py).

    Rows are never edited: a new price is a new row from its own time, so every call keeps the
    price that applied when it was made (recorded on its model-call step, row id and values).
    ``model`` "" prices every model the endpoint serves that has no row of its own. A
    self-hosted endpoint may have a price (its GPU-hours spread over the tokens they serve) or
    none: its calls then have no cost (shown as "—", never as 0).
    """

    endpoint = models.ForeignKey(PolicyEndpoint, on_delete=models.CASCADE, related_name="prices")
    model = models.CharField(max_length=200, blank=True, default="")
    effective_from = models.DateTimeField()
    input_per_m = models.DecimalField(max_digits=12, decimal_places=6)
    # Prompt tokens the provider served from its prompt cache (OpenAI's cached_tokens,
    # Anthropic's cache reads), at their own price.
    cached_input_per_m = models.DecimalField(max_digits=12, decimal_places=6)
    # Prompt tokens the provider wrote to its prompt cache (Anthropic's cache writes, dearer
    # than input: 1.25x its price for a 5-minute cache, 2x for an hour); null: the input price.
    cache_write_per_m = models.DecimalField(max_digits=12, decimal_places=6, null=True, blank=True)
    output_per_m = models.DecimalField(max_digits=12, decimal_places=6)
    note = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["endpoint", "model", "-effective_from"]
        constraints = [
            # One price per endpoint, model and moment: the price at a time is never ambiguous.
            models.UniqueConstraint(
                fields=["endpoint", "model", "effective_from"], name="model_price_unique_from"
            ),
            models.CheckConstraint(
                condition=Q(input_per_m__gte=0)
                & Q(cached_input_per_m__gte=0)
                & (Q(cache_write_per_m__isnull=True) | Q(cache_write_per_m__gte=0))
                & Q(output_per_m__gte=0),
                name="model_price_not_negative",
            ),
        ]
        indexes = [
            # model_price_schedule: an endpoint's rows, newest first.
            models.Index(fields=["endpoint", "-effective_from"], name="model_price_endpoint_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.model or 'any model'} on {self.endpoint.name} from {self.effective_from}"
