#!/bin/bash
set -e
python - <<'EOF'
p = "/app/roman.py"
s = open(p).read()
old = '_NUMERALS = [(1000, "M"), (500, "D"), (100, "C"), (50, "L"), (10, "X"), (5, "V"), (1, "I")]'
new = ('_NUMERALS = [(1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),\n'
       '             (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I")]')
assert old in s
open(p, "w").write(s.replace(old, new))
EOF
