from palindrome import is_palindrome


def test_basic():
    assert is_palindrome("racecar")
    assert not is_palindrome("hello")
