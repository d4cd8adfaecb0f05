"""Run-length encoding for strings that contain no digits."""


def encode(text):
    """Encode `text` as consecutive runs written <count><char>.

    encode("aaabcc") == "3a1b2c"; encode("") == "".
    Runs longer than 9 use multi-digit counts: encode("a" * 12) == "12a".
    `text` never contains digits; any other character (including
    spaces and newlines) may appear.
    """
    raise NotImplementedError


def decode(encoded):
    """Inverse of encode: decode("3a1b2c") == "aaabcc"; decode("") == "".

    `encoded` must be a sequence of <count><char> pairs where <count>
    is a positive decimal integer and <char> is a single non-digit
    character. Raise ValueError otherwise, e.g. for "a", "3", "0a",
    "3ab".
    """
    raise NotImplementedError
