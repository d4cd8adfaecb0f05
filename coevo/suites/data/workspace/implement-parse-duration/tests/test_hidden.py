import pytest

from duration import parse_duration

VALID = [
    ("45s", 45), ("1h30m", 5400), ("2d4h", 187200), ("0s", 0), ("90m", 5400),
    ("1d1h1m1s", 90061), ("  10m \n", 600), ("100h", 360000), ("007s", 7),
    ("1d", 86400), ("3h5s", 10805), ("2m0s", 120),
]
INVALID = ["", "   ", "10", "1x", "h", "1.5h", "-5m", "1m1h", "1h1h",
           "1h 30m", "1H", "s5", "1hm", "5s5", "1d 2h"]


@pytest.mark.parametrize("text,seconds", VALID)
def test_valid(text, seconds):
    result = parse_duration(text)
    assert result == seconds
    assert type(result) is int


@pytest.mark.parametrize("text", INVALID)
def test_invalid(text):
    with pytest.raises(ValueError):
        parse_duration(text)
