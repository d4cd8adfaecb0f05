"""Output serializers: one definition of each response, which the schema reads too.

Every ``...Out`` serializer renders its response (``ApiView.out``, ``paginate``); none builds a
dict beside it. Its context holds the view (``OutSerializer.view``) for absolute links.
"""

from __future__ import annotations

import math
from typing import Any

from rest_framework import serializers


class OutSerializer(serializers.Serializer):
    @property
    def view(self) -> Any:
        """The ApiView answering (``self.view.absolute(...)`` builds links)."""
        return self.context["view"]


class MethodField(serializers.Field):
    """A value the serializer computes (its ``get_<name>(obj)``, as SerializerMethodField),
    declared in the schema as ``schema`` says: its type, bounds and nullability.

    The method's value goes out as it is returned."""

    def __init__(self, schema: serializers.Field, **kwargs: Any) -> None:
        kwargs["source"] = "*"
        super().__init__(**kwargs)
        # drf-spectacular maps a field with this annotation as the annotated field.
        self._spectacular_annotation = {"field": schema}

    def to_representation(self, value: Any) -> Any:
        return getattr(self.parent, f"get_{self.field_name}")(value)


class FiniteFloatField(serializers.FloatField):
    """A float that JSON can carry: NaN and ±infinity (an empty mean, an undefined
    interval) go out as null."""

    def to_representation(self, value: Any) -> float | None:
        return float(value) if math.isfinite(value) else None


def finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)
