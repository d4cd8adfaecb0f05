import csv
from pathlib import Path

EXPECTED = [["id", "name", "email"], ["1", "Linus", "linus@example.net"], ["2", "Smith, John", "john.smith@example.com"], ["10", "Grace Hopper", "grace@example.com"], ["15", "Margaret \"Maggie\" Hamilton", "mh@example.com"], ["21", "Barbara Liskov", "liskov@example.edu"]]


def test_active_users_csv():
    with open("/app/active_users.csv", newline="") as f:
        rows = [row for row in csv.reader(f) if row]
    assert rows == EXPECTED


def test_header_line_exact():
    first = Path("/app/active_users.csv").read_text().splitlines()[0]
    assert first.strip() == "id,name,email"
