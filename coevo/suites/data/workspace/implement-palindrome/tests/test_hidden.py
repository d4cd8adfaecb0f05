import pytest

from palindrome import is_palindrome


@pytest.mark.parametrize("text,expected", [
    ("racecar", True),
    ("hello", False),
    ("A man, a plan, a canal: Panama", True),
    ("No 'x' in Nixon", True),
    ("race a car", False),
    ("", True),
    ("a", True),
    ("ab", False),
    ("12321", True),
    ("123 21", True),
    ("12 3 4", False),
    ("Was it a car or a cat I saw?", True),
    ("!!", True),
    ("Ab,bA", True),
])
def test_is_palindrome(text, expected):
    assert bool(is_palindrome(text)) is expected
