#!/bin/bash
set -e
cat > /app/semver.py <<'EOF'
"""Semantic version precedence (a subset of SemVer 2.0.0)."""
import functools
import re

_VERSION = re.compile(
    r"([0-9]+)\.([0-9]+)\.([0-9]+)"
    r"(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
)


def _parse(version):
    m = _VERSION.fullmatch(version)
    if m is None:
        raise ValueError("malformed version: %r" % (version,))
    core = tuple(int(x) for x in m.group(1, 2, 3))
    pre = m.group(4).split(".") if m.group(4) else []
    return core, pre


def _cmp(x, y):
    return (x > y) - (x < y)


def _cmp_ident(x, y):
    xd, yd = x.isdigit(), y.isdigit()
    if xd and yd:
        return _cmp(int(x), int(y))
    if xd != yd:
        return -1 if xd else 1
    return _cmp(x, y)


def compare(a, b):
    """Return -1, 0 or 1 by SemVer precedence."""
    (core_a, pre_a), (core_b, pre_b) = _parse(a), _parse(b)
    if core_a != core_b:
        return _cmp(core_a, core_b)
    if not pre_a or not pre_b:
        return _cmp(not pre_a, not pre_b)
    for x, y in zip(pre_a, pre_b):
        c = _cmp_ident(x, y)
        if c:
            return c
    return _cmp(len(pre_a), len(pre_b))


def sort_versions(versions):
    """Return a new list sorted by precedence (stable)."""
    return sorted(versions, key=functools.cmp_to_key(compare))
EOF
