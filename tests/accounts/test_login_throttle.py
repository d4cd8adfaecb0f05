"""The login throttle: failed password checks counted per username and per client address in
the shared cache (Redis here), on every path that takes a password (login page, admin login,
the old password of the password page); and the password policy."""

from __future__ import annotations

import re
import time

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.test import Client, RequestFactory
from django.urls import reverse

from coevo.accounts.login_throttle import client_address, login_throttle_reset
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db

# Addresses from the documentation ranges (RFC 5737, RFC 3849), so no test shares one with
# another test's (or another run's) counters; each test's are reset before and after it.
ADDRESSES = ["198.51.100.7", "198.51.100.8", "203.0.113.9", "2001:db8:1:2::1", "2001:db8:1:2::2"]
USERNAMES = ["owner", "outsider", "nobody-at-all", "admin"]
WRONG = "not-the-password"


@pytest.fixture(autouse=True)
def _throttle_clean():
    def reset() -> None:
        for username in USERNAMES:
            login_throttle_reset(username=username)
        for address in ADDRESSES:
            login_throttle_reset(address=address)

    reset()
    yield
    reset()


def client_from(address: str) -> Client:
    return Client(REMOTE_ADDR=address)


def log_in(client: Client, username: str, password: str):
    return client.post(reverse("login"), {"username": username, "password": password})


def logged_in_as(client: Client) -> str | None:
    response = client.get(reverse("web:home"))
    return response.wsgi_request.user.get_username() if response.status_code == 200 else None


def test_it_refuses_even_the_right_password_after_ten_failures_and_says_when_to_retry(
    owner, project
):
    client = client_from(ADDRESSES[0])

    answers = [log_in(client, "owner", WRONG) for _ in range(10)]
    right = log_in(client, "owner", PASSWORD)

    assert [a.status_code for a in answers[:9]] == [200] * 9
    assert "Please enter a correct username and password" in answers[0].content.decode()
    # The tenth failure reaches the limit and already answers with the block.
    for response in (answers[9], right):
        assert response.status_code == 429
        assert 840 < int(response["Retry-After"]) <= 900
        assert (
            "Too many failed logins for this username or from this address: try again in 15 "
            "minutes." in response.content.decode()
        )
    assert logged_in_as(client) is None
    # Another address gets the same refusal for this account.
    assert log_in(client_from(ADDRESSES[1]), "owner", PASSWORD).status_code == 429


def test_it_counts_failures_per_address_across_usernames(owner, outsider, project):
    guesser = client_from(ADDRESSES[0])

    for username in ["outsider", "nobody-at-all"] * 5:
        log_in(guesser, username, WRONG)

    # Blocked from that address, whichever account it tries next...
    assert log_in(guesser, "owner", PASSWORD).status_code == 429
    # ... while the account logs in from elsewhere (its own count is 0).
    elsewhere = client_from(ADDRESSES[1])
    assert log_in(elsewhere, "owner", PASSWORD).status_code == 302
    assert logged_in_as(elsewhere) == "owner"


def test_the_refusal_reads_the_same_whether_or_not_the_account_exists(settings, outsider):
    settings.COEVO_LOGIN_MAX_FAILURES = 3
    known = [log_in(client_from(ADDRESSES[0]), "outsider", WRONG) for _ in range(4)]
    unknown = [log_in(client_from(ADDRESSES[1]), "nobody-at-all", WRONG) for _ in range(4)]

    assert (
        [r.status_code for r in known] == [r.status_code for r in unknown] == [200, 200, 429, 429]
    )
    assert [error_of(r) for r in known] == [error_of(r) for r in unknown]
    assert "Too many failed logins" in error_of(known[-1])


def error_of(response) -> str:
    found = re.search(
        r'<div class="alert error" role="alert" id="login-error">(.*?)</div>',
        response.content.decode(),
        re.S,
    )
    assert found, "the login page shows its error"
    return found.group(1)


def test_a_right_password_starts_the_account_count_again(settings, owner, project):
    settings.COEVO_LOGIN_MAX_FAILURES = 4
    for address in ADDRESSES[:2]:
        client = client_from(address)
        for _ in range(3):
            assert log_in(client, "owner", WRONG).status_code == 200
        assert log_in(client, "owner", PASSWORD).status_code == 302

    # Six failures in all, but never four in a row: the account was never blocked.
    assert logged_in_as(client) == "owner"


def test_a_block_ends_after_the_window(settings, owner, project):
    settings.COEVO_LOGIN_MAX_FAILURES = 2
    settings.COEVO_LOGIN_WINDOW_S = 1
    client = client_from(ADDRESSES[0])
    log_in(client, "owner", WRONG)
    assert log_in(client, "owner", WRONG).status_code == 429

    time.sleep(1.2)

    assert log_in(client, "owner", PASSWORD).status_code == 302


def test_the_admin_login_is_throttled_too(settings):
    settings.COEVO_LOGIN_MAX_FAILURES = 3
    get_user_model().objects.create_superuser("admin", "admin@example.com", PASSWORD)
    client = client_from(ADDRESSES[0])
    url = reverse("admin:login")

    for _ in range(3):
        client.post(url, {"username": "admin", "password": WRONG, "next": "/admin/"})
    response = client.post(url, {"username": "admin", "password": PASSWORD, "next": "/admin/"})

    assert response.status_code == 200  # the admin's own login page, with the refusal on it
    assert "Too many failed logins" in response.content.decode()
    assert client.get("/admin/").status_code == 302  # still sent to the login page


def test_the_old_password_of_the_password_page_counts_as_a_login(settings, owner, project):
    settings.COEVO_LOGIN_MAX_FAILURES = 3
    session = client_from(ADDRESSES[0])
    session.force_login(owner)  # a stolen session cannot guess the password through this page
    url = reverse("accounts:password_change")
    new = {"new_password1": "a-new-long-passphrase", "new_password2": "a-new-long-passphrase"}

    answers = [session.post(url, {"old_password": WRONG, **new}) for _ in range(3)]
    right = session.post(url, {"old_password": PASSWORD, **new})

    assert [a.status_code for a in answers] == [200, 200, 429]
    assert right.status_code == 429 and "Too many failed logins" in right.content.decode()
    owner.refresh_from_db()
    assert owner.check_password(PASSWORD)
    # The account is blocked for logins too, from any address.
    assert log_in(client_from(ADDRESSES[1]), "owner", PASSWORD).status_code == 429


def test_the_admin_password_page_sends_staff_to_the_throttled_one():
    admin = get_user_model().objects.create_superuser("admin", "admin@example.com", PASSWORD)
    client = client_from(ADDRESSES[0])
    client.force_login(admin)
    new = {"new_password1": "a-new-long-passphrase", "new_password2": "a-new-long-passphrase"}

    page = client.get("/admin/password_change/")
    post = client.post("/admin/password_change/", {"old_password": WRONG, **new})

    assert page.status_code == post.status_code == 302
    assert page["Location"] == post["Location"] == reverse("accounts:password_change")
    admin.refresh_from_db()
    assert admin.check_password(PASSWORD)  # no password was checked, nor changed, there


def test_it_counts_an_ipv6_client_by_its_64_prefix(settings, owner, outsider, project):
    settings.COEVO_LOGIN_MAX_FAILURES = 2
    log_in(client_from(ADDRESSES[3]), "outsider", WRONG)
    log_in(client_from(ADDRESSES[4]), "nobody-at-all", WRONG)

    assert log_in(client_from(ADDRESSES[4]), "owner", PASSWORD).status_code == 429


# --- the client address ---------------------------------------------------------------------


def test_the_client_address_is_remote_addr_and_a_forwarded_header_alone_changes_nothing(
    settings,
):
    settings.COEVO_TRUSTED_PROXIES = []
    request = RequestFactory().get(
        "/", REMOTE_ADDR="198.51.100.7", HTTP_X_FORWARDED_FOR="203.0.113.9"
    )
    assert client_address(request) == "198.51.100.7"


def test_a_trusted_proxy_names_the_nearest_untrusted_hop(settings):
    settings.COEVO_TRUSTED_PROXIES = ["10.0.0.0/8", "::1/128"]

    def address(remote: str, forwarded: str) -> str | None:
        request = RequestFactory().get("/", REMOTE_ADDR=remote, HTTP_X_FORWARDED_FOR=forwarded)
        return client_address(request)

    # The client wrote the left-most entry itself: only the proxy's own entry counts.
    assert address("10.0.0.2", "1.2.3.4, 203.0.113.9") == "203.0.113.9"
    assert address("10.0.0.2", "203.0.113.9, 10.0.0.3") == "203.0.113.9"
    assert address("::1", "[2001:db8::5]") == "2001:db8::5"
    # A malformed hop ends the walk; only proxies: the nearest proxy is what is known.
    assert address("10.0.0.2", "203.0.113.9, junk") == "10.0.0.2"
    assert address("10.0.0.2", "") == "10.0.0.2"
    # An untrusted peer's header is ignored.
    assert address("198.51.100.7", "203.0.113.9") == "198.51.100.7"


def test_a_proxy_that_is_trusted_throttles_the_forwarded_client(settings, owner, project):
    settings.COEVO_TRUSTED_PROXIES = ["10.0.0.0/8"]
    settings.COEVO_LOGIN_MAX_FAILURES = 2
    behind = Client(REMOTE_ADDR="10.1.2.3", HTTP_X_FORWARDED_FOR=ADDRESSES[0])
    neighbour = Client(REMOTE_ADDR="10.1.2.3", HTTP_X_FORWARDED_FOR=ADDRESSES[1])
    for username in ("outsider", "nobody-at-all"):
        log_in(behind, username, WRONG)

    assert log_in(behind, "owner", PASSWORD).status_code == 429
    # Another client behind the same proxy is not blocked with it.
    assert log_in(neighbour, "owner", PASSWORD).status_code == 302


# --- password policy ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("password", "why"),
    [
        ("48151623424815", "This password is entirely numeric."),
        ("qwertyuiop", "This password is too common."),
        ("owner@example.com", "The password is too similar to the"),
        ("short1!", "This password is too short."),
    ],
)
def test_it_refuses_weak_new_passwords(client, owner, project, password, why):
    client.force_login(owner)

    response = client.post(
        reverse("accounts:password_change"),
        {"old_password": PASSWORD, "new_password1": password, "new_password2": password},
    )

    assert response.status_code == 200 and why in response.content.decode()
    owner.refresh_from_db()
    assert owner.check_password(PASSWORD)


def test_the_test_password_passes_the_validators(owner):
    assert validate_password(PASSWORD, user=owner) is None  # raises ValidationError if not
