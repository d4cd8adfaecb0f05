from pathlib import Path


def test_status_counts():
    expected = Path("/tests/expected_status_counts.txt").read_text().splitlines()
    got = Path("/app/status_counts.txt").read_text().splitlines()
    got = [line.strip() for line in got]
    while got and got[-1] == "":
        got.pop()
    assert got == expected
