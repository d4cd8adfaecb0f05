"""Roman numerals."""

_NUMERALS = [(1000, "M"), (500, "D"), (100, "C"), (50, "L"), (10, "X"), (5, "V"), (1, "I")]
_VALUES = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def to_roman(n):
    """Convert an integer 1..3999 to a Roman numeral in standard
    subtractive notation (4 -> "IV", 1994 -> "MCMXCIV").
    Raise ValueError outside 1..3999."""
    if not 0 < n < 4000:
        raise ValueError("out of range: %r" % (n,))
    out = []
    for value, symbol in _NUMERALS:
        while n >= value:
            out.append(symbol)
            n -= value
    return "".join(out)


def from_roman(s):
    """Parse a Roman numeral (standard notation) into an integer."""
    total = 0
    for i, ch in enumerate(s):
        v = _VALUES[ch]
        if i + 1 < len(s) and _VALUES[s[i + 1]] > v:
            total -= v
        else:
            total += v
    return total
