from pathlib import Path


def test_unique_emails():
    lines = Path("/app/unique_emails.txt").read_text().splitlines()
    assert [line.rstrip("\r") for line in lines] == [
        "alice@example.com",
        "bob@example.com",
        "carol@example.org",
        "dave@example.net",
        "erin@example.com",
    ]
