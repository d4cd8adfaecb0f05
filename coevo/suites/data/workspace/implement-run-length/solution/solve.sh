#!/bin/bash
set -e
cat > /app/rle.py <<'EOF'
"""Run-length encoding for strings that contain no digits."""
import re
from itertools import groupby


def encode(text):
    """Encode `text` as consecutive runs written <count><char>."""
    return "".join(f"{len(list(group))}{ch}" for ch, group in groupby(text))


_PAIR = re.compile(r"([0-9]+)([^0-9])", re.DOTALL)


def decode(encoded):
    """Inverse of encode; raise ValueError on malformed input."""
    out = []
    pos = 0
    while pos < len(encoded):
        m = _PAIR.match(encoded, pos)
        if not m or int(m.group(1)) < 1:
            raise ValueError("malformed run-length data at %d" % pos)
        out.append(m.group(2) * int(m.group(1)))
        pos = m.end()
    return "".join(out)
EOF
