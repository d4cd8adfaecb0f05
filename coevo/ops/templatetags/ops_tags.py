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
