import pytest

from roman import from_roman, to_roman

KNOWN = {1: "I", 4: "IV", 9: "IX", 14: "XIV", 40: "XL", 44: "XLIV", 90: "XC",
         99: "XCIX", 400: "CD", 444: "CDXLIV", 900: "CM", 1994: "MCMXCIV",
         2024: "MMXXIV", 3888: "MMMDCCCLXXXVIII", 3999: "MMMCMXCIX"}


def reference(n):
    table = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"),
             (90, "XC"), (50, "L"), (40, "XL"), (10, "X"), (9, "IX"),
             (5, "V"), (4, "IV"), (1, "I")]
    out = ""
    for value, symbol in table:
        while n >= value:
            out += symbol
            n -= value
    return out


def test_known():
    for n, s in KNOWN.items():
        assert to_roman(n) == s


def test_all_values():
    for n in range(1, 4000):
        s = to_roman(n)
        assert s == reference(n)
        assert from_roman(s) == n


def test_out_of_range():
    for bad in (0, -1, 4000):
        with pytest.raises(ValueError):
            to_roman(bad)
