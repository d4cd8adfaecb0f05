import pytest

from duration import parse_duration


def test_examples():
    assert parse_duration("45s") == 45
    assert parse_duration("1h30m") == 5400


def test_empty_is_invalid():
    with pytest.raises(ValueError):
        parse_duration("")
