import pytest


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings):
    """Users are made per test; the production hasher's deliberate slowness is not tested here."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
