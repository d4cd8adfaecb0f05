#!/bin/bash
set -e
cat > /app/duration.py <<'EOF'
"""Duration strings."""
import re

_PATTERN = re.compile(r"(?:([0-9]+)d)?(?:([0-9]+)h)?(?:([0-9]+)m)?(?:([0-9]+)s)?")
_FACTORS = (86400, 3600, 60, 1)


def parse_duration(text):
    """Parse a duration such as "1h30m" into a number of seconds (int)."""
    text = text.strip()
    m = _PATTERN.fullmatch(text)
    if not text or m is None:
        raise ValueError("invalid duration: %r" % (text,))
    return sum(int(g) * f for g, f in zip(m.groups(), _FACTORS) if g is not None)
EOF
