"""Reading configuration from the environment, with clear errors for bad values.

Every variable coevo reads is listed in README.md ("Configuration"); read them through these
helpers so that a bad value names the variable and what was expected.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(
        f"{name}={raw!r} is not a boolean: use 1/0, true/false, yes/no or on/off."
    )


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer.") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} is below its minimum of {minimum}.")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def home_dir() -> Path:
    """Where the embedded default keeps its state (database, broker folders, harness store)."""
    home = Path(os.environ.get("COEVO_HOME", BASE_DIR / "var")).resolve()
    home.mkdir(parents=True, exist_ok=True)
    return home


def secret_key(home: Path) -> str:
    """COEVO_SECRET_KEY, or a random key generated once and kept under COEVO_HOME."""
    key = os.environ.get("COEVO_SECRET_KEY")
    if key:
        return key
    path = home / "secret_key"
    if not path.exists():
        import secrets

        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()
