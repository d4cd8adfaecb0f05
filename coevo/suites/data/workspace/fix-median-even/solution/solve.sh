#!/bin/bash
set -e
python - <<'EOF'
p = "/app/stats.py"
s = open(p).read()
old = "    return s[n // 2]\n"
new = ("    if n % 2 == 1:\n"
       "        return s[n // 2]\n"
       "    return (s[n // 2 - 1] + s[n // 2]) / 2\n")
assert old in s
open(p, "w").write(s.replace(old, new))
EOF
