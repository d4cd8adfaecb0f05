"""Interval helpers."""


def merge_intervals(intervals):
    """Merge overlapping closed intervals.

    `intervals` is an iterable of (start, end) pairs (tuples or lists)
    with start <= end, in any order. Intervals that overlap or touch
    (e.g. (1, 3) and (3, 5)) are merged into one.
    Return a new list of (start, end) tuples sorted by start.
    The input is not modified.
    """
    result = []
    for start, end in intervals:
        if result and start < result[-1][1]:
            result[-1] = (result[-1][0], end)
        else:
            result.append((start, end))
    return result
