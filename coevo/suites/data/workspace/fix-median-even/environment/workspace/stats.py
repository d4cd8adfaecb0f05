"""Small statistics helpers."""


def mean(xs):
    """Arithmetic mean of a non-empty sequence of numbers."""
    if not xs:
        raise ValueError("mean of empty data")
    return sum(xs) / len(xs)


def median(xs):
    """Median of a non-empty sequence of numbers.

    For an even number of values the median is the mean of the two
    middle values. The input is not modified.
    """
    if not xs:
        raise ValueError("median of empty data")
    s = sorted(xs)
    n = len(s)
    return s[n // 2]
