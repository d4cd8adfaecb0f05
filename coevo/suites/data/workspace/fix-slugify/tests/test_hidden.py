import pytest

from slug import slugify


@pytest.mark.parametrize("text,expected", [
    ("Hello World", "hello-world"),
    ("Hello,  World!", "hello-world"),
    ("  Leading and trailing  ", "leading-and-trailing"),
    ("a---b", "a-b"),
    ("", ""),
    ("!!!", ""),
    ("Caf\u00e9 au lait", "caf-au-lait"),
    ("Version 2.0 Released", "version-2-0-released"),
    ("already-a-slug", "already-a-slug"),
    ("Tabs\tand\nnewlines", "tabs-and-newlines"),
])
def test_slugify(text, expected):
    assert slugify(text) == expected


def test_max_length():
    assert slugify("abc def", max_length=4) == "abc"
    assert slugify("abcdef", max_length=3) == "abc"
    assert slugify("x" * 60) == "x" * 50
    assert slugify("ab  cd", max_length=5) == "ab-cd"
    assert slugify("--ab--cd--", max_length=3) == "ab"
