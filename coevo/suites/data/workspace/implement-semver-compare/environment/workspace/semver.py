"""Semantic version precedence (a subset of SemVer 2.0.0)."""


def compare(a, b):
    """Return -1 if version a < b, 0 if they have equal precedence, 1 if a > b.

    Versions look like MAJOR.MINOR.PATCH[-PRERELEASE][+BUILD]:
    * MAJOR, MINOR and PATCH are non-negative integers (digits only),
      compared numerically: 1.10.0 > 1.9.0.
    * A version with a PRERELEASE has lower precedence than the same
      version without one: 1.0.0-alpha < 1.0.0.
    * PRERELEASE is a dot-separated list of non-empty identifiers made
      of [0-9A-Za-z-]. Identifiers are compared left to right:
      all-digit identifiers numerically, other identifiers lexically
      in ASCII order; an all-digit identifier is lower than any other
      identifier; if all compared identifiers are equal, the version
      with fewer identifiers is lower (1.0.0-alpha < 1.0.0-alpha.1).
    * BUILD (after "+") is ignored: 1.0.0+a and 1.0.0+b are equal.
    Raise ValueError for malformed versions, e.g. "", "1.2", "1.2.x",
    "a.b.c", "1.0.0-" (empty pre-release), "1.0.0-alpha..1".
    """
    raise NotImplementedError


def sort_versions(versions):
    """Return a new list with `versions` sorted from lowest to highest
    precedence. Versions of equal precedence keep their input order."""
    raise NotImplementedError
