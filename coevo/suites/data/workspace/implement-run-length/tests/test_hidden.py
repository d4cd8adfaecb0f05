import pytest

from rle import decode, encode


def test_encode_cases():
    assert encode("") == ""
    assert encode("a") == "1a"
    assert encode("abc") == "1a1b1c"
    assert encode("a" * 12) == "12a"
    assert encode("a" * 100 + "b") == "100a1b"
    assert encode("aabbaa") == "2a2b2a"
    assert encode("a  b") == "1a2 1b"
    assert encode("x\n\n") == "1x2\n"


def test_decode_cases():
    assert decode("") == ""
    assert decode("12a") == "a" * 12
    assert decode("2a3a") == "aaaaa"
    assert decode("1 2-") == " --"


@pytest.mark.parametrize("text", ["hello", "aaaaaaaaaaaaaaaabbb", "  \t\t!!", "z" * 1000, "ab" * 20])
def test_round_trip(text):
    assert decode(encode(text)) == text


@pytest.mark.parametrize("bad", ["a", "3", "0a", "3ab", "12", "a3", "3a4"])
def test_decode_invalid(bad):
    with pytest.raises(ValueError):
        decode(bad)
