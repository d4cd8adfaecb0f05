"""Reading configuration from the environment, with clear errors for bad values.

Every variable coevo reads is listed in docs/configuration.md (name, default, meaning, which
process reads it); tests/test_config.py fails when a ``COEVO_*`` name in the code is missing
there. Read every variable through these helpers: a bad value then stops the process at
start-up with ImproperlyConfigured naming the variable and what was expected, instead of
failing later, somewhere else, with a message that names neither.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _raw(name: str) -> str | None:
    """The variable's value, or None when it is unset or blank (blank means "the default")."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    return raw


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


def env_int(
    name: str, default: int, *, minimum: int | None = None, maximum: int | None = None
) -> int:
    raw = _raw(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer.") from None
    _check_range(name, value, minimum, maximum)
    return value


def env_float(
    name: str, default: float, *, minimum: float | None = None, maximum: float | None = None
) -> float:
    raw = _raw(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number.") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ImproperlyConfigured(f"{name}={raw!r} is not a finite number.")
    _check_range(name, value, minimum, maximum)
    return value


def env_choice(name: str, default: str, choices: Iterable[str], *, upper: bool = False) -> str:
    """One of ``choices`` (compared case-insensitively; returned upper-cased if ``upper``)."""
    allowed = list(choices)
    raw = _raw(name)
    if raw is None:
        return default
    value = raw.strip()
    for choice in allowed:
        if value.lower() == choice.lower():
            return choice.upper() if upper else choice
    raise ImproperlyConfigured(f"{name}={raw!r} is not one of: {', '.join(allowed)}.")


def env_url(name: str, default: str, *, schemes: Iterable[str]) -> str:
    """A URL whose scheme is one of ``schemes`` (e.g. ``postgres``, ``redis``)."""
    allowed = list(schemes)
    raw = _raw(name)
    value = default if raw is None else raw.strip()
    scheme = urlsplit(value).scheme.lower()
    if scheme not in allowed:
        raise ImproperlyConfigured(
            f"{name}={value!r} is not a URL coevo can use: its scheme must be one of "
            f"{', '.join(s + '://' for s in allowed)}."
        )
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_mapping(name: str) -> dict[str, str]:
    """A comma-separated list of ``key=value`` pairs (``python:3.13=local/debian:trixie, ...``),
    each side non-empty; unset: empty."""
    mapping: dict[str, str] = {}
    for item in env_list(name, []):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ImproperlyConfigured(
                f"{name} holds {item!r}, which is not a pair NAME=VALUE (e.g. "
                "python:3.13-slim-bookworm=local/debian:trixie)."
            )
        mapping[key.strip()] = value.strip()
    return mapping


def env_networks(name: str) -> list[str]:
    """A comma-separated list of IP addresses or CIDR networks (``10.0.0.0/8, ::1``), each
    checked; returned as network strings (``10.0.0.0/8``, ``::1/128``). Unset: empty."""
    networks = []
    for item in env_list(name, []):
        try:
            networks.append(str(ipaddress.ip_network(item, strict=False)))
        except ValueError:
            raise ImproperlyConfigured(
                f"{name} holds {item!r}, which is not an IP address or network (e.g. "
                "10.0.0.5 or 172.16.0.0/12)."
            ) from None
    return networks


def env_path(name: str, default: Path | str) -> Path:
    """An absolute path (a relative one is taken from the current directory, as a shell would);
    it need not exist yet."""
    raw = _raw(name)
    value = Path(default if raw is None else raw).expanduser()
    if "\x00" in str(value):
        raise ImproperlyConfigured(f"{name} holds a NUL character, which no path may contain.")
    return value.resolve()


def _check_range(name: str, value: float, minimum: float | None, maximum: float | None) -> None:
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} is below its minimum of {minimum}.")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name}={value} is above its maximum of {maximum}.")


# Group and other permission bits. Nothing under COEVO_HOME is for other local users: the
# SQLite database holds sessions and token hashes, the broker folders queued tasks.
OTHERS_BITS = 0o077


def _tighten(path: Path) -> None:
    """Take group and other permissions off ``path`` when this user owns it. Another owner's
    file is left alone (root must not rewrite what an operator chose): ``coevo doctor`` names
    it."""
    try:
        status = path.stat()
    except OSError:
        return
    if status.st_uid == os.geteuid() and status.st_mode & OTHERS_BITS:
        with contextlib.suppress(OSError):  # a read-only filesystem: the doctor reports it
            path.chmod(stat.S_IMODE(status.st_mode) & ~OTHERS_BITS)


def private_dir(path: Path) -> None:
    """``path`` as a directory only its owner can enter: created 0700 (its parents as the
    umask makes them), or tightened when an earlier version made it open."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    _tighten(path)


def private_file(path: Path) -> None:
    """``path`` as a file only its owner can read: created empty with mode 0600 before anything
    opens it (the umask does not widen an ``open`` mode), or tightened when it exists."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        _tighten(path)
    except OSError:
        pass  # a missing or read-only directory: whoever opens the file reports it


def sqlite_private(name: str) -> None:
    """Keep a SQLite database and its journals private. SQLite creates a database 0644 (less
    the umask), but its ``-wal``, ``-shm`` and ``-journal`` files with the database's own
    mode, so a database created 0600 keeps them all private."""
    if not name or name == ":memory:" or name.startswith("file:"):
        return
    private_file(Path(name))
    for suffix in ("-wal", "-shm", "-journal"):
        _tighten(Path(name + suffix))


def home_dir() -> Path:
    """Where the embedded default keeps its state (database, broker folders, harness store):
    a directory only coevo's user can enter, whatever the umask. That directory is the
    boundary, not a 077 umask: harness trees and environments under it are bound into
    sandboxes whose uid is another one, which must still read them."""
    home = env_path("COEVO_HOME", BASE_DIR / "var")
    try:
        private_dir(home)
    except OSError as exc:
        raise ImproperlyConfigured(
            f"COEVO_HOME={str(home)!r} cannot be created ({exc.strerror}): point it at a "
            "writable directory."
        ) from None
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
