"""Tiny inventory package."""
from .models import Item
from .report import format_cents, low_stock, total_value_cents

__all__ = ["Item", "format_cents", "low_stock", "total_value_cents"]
