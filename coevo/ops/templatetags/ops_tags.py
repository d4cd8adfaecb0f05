import time

from django import template

register = template.Library()


@register.filter
def humanize_bytes(value: int | None) -> str:
    """1536 -> "1.5 KiB"."""
    if value is None:
        return "—"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{value} B"


@register.filter
def slot_since(value: float | None) -> str:
    """A slot holder's start (epoch seconds) as how long ago: "42 s ago"."""
    if not value:
        return "—"
    seconds = max(0, int(time.time() - float(value)))
    return f"{seconds} s ago" if seconds < 120 else f"{seconds // 60} min ago"
