"""Duration strings."""


def parse_duration(text):
    """Parse a duration such as "1h30m" into a number of seconds (int).

    Format: one or more <number><unit> parts written without spaces,
    where <number> is one or more ASCII digits (0-9) and <unit> is one
    of d (86400 s), h (3600 s), m (60 s), s (1 s), lowercase.
    Units must appear in that order (d, h, m, s), each at most once.
    Leading and trailing whitespace is ignored. Values may exceed
    their natural range ("90m" == 5400).

    Examples: "45s" -> 45, "1h30m" -> 5400, "2d4h" -> 187200, "0s" -> 0.

    Raise ValueError for anything else, e.g. "", "10", "1x", "h",
    "1.5h", "-5m", "1m1h" (wrong order), "1h1h" (repeated unit),
    "1h 30m" (inner space).
    """
    raise NotImplementedError
