from rle import decode, encode


def test_encode():
    assert encode("aaabcc") == "3a1b2c"


def test_decode():
    assert decode("3a1b2c") == "aaabcc"
