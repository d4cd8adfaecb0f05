"""Policy endpoints' API keys, encrypted at rest.

A hosted endpoint's API key is a secret: the database holds it only as a Fernet token
(AES-128-CBC with an HMAC-SHA256, from the ``cryptography`` package) made with the operator's
key, ``COEVO_SECRETS_KEY``, which lives in the environment of the web and worker processes and
never in the database, so a database dump or backup does not give the keys away. The setting
is a comma-separated list of Fernet keys: the first encrypts, each decrypts, so the operator
rotates it by putting a new key first and re-saving the endpoints' keys (docs/configuration.md).
Nothing derives it from Django's SECRET_KEY: the two are rotated for different reasons.

Only the worker that sends a request and the service that stores a key see it in plain text.
"""

from __future__ import annotations

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings

from coevo.errors import InvalidInput

# An API key longer than this is not one (OpenAI's and Anthropic's are about 100 characters).
MAX_API_KEY_CHARS = 1000
_FIX = (
    "Set COEVO_SECRETS_KEY in the environment of the web and worker processes to a key made by "
    "`python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'` "
    "(docs/configuration.md)."
)


class SecretsKeyMissing(InvalidInput):
    """No usable COEVO_SECRETS_KEY: an API key can be neither stored nor read."""

    code = "secrets_key_missing"


class SecretUnreadable(InvalidInput):
    """A stored API key that none of COEVO_SECRETS_KEY's keys decrypts (the key it was stored
    with was taken out of the setting)."""

    code = "secret_unreadable"


def _fernet() -> MultiFernet:
    keys = [k.strip() for k in (settings.COEVO_SECRETS_KEY or "").split(",") if k.strip()]
    if not keys:
        raise SecretsKeyMissing(f"No key to encrypt API keys with. {_FIX}")
    try:
        return MultiFernet([Fernet(key) for key in keys])
    except ValueError as exc:
        raise SecretsKeyMissing(
            f"COEVO_SECRETS_KEY holds a value that is not a Fernet key ({exc}). {_FIX}"
        ) from None


def secret_encrypt(*, plain: str) -> str:
    """The token to store for ``plain`` (an API key)."""
    return _fernet().encrypt(plain.encode()).decode()


def secret_decrypt(*, token: str) -> str:
    """The API key a stored token holds ("" for no token)."""
    if not token:
        return ""
    try:
        return _fernet().decrypt(token.encode()).decode()
    except InvalidToken:
        raise SecretUnreadable(
            "A stored API key cannot be decrypted with COEVO_SECRETS_KEY: the key it was "
            "stored with is no longer among the setting's keys. Put it back (after the new "
            "one) or set the endpoint's API key again in the admin."
        ) from None
