#!/bin/bash
set -e
cd /app
python - <<'EOF'
import re
from collections import Counter
text = open("access.log").read()
counts = Counter(m.group(1) for m in re.finditer(r'^\S+ \S+ \S+ \[[^]]*\] "[^"]*" (\d{3}) ', text, re.M))
with open("status_counts.txt", "w") as f:
    for code in sorted(counts, key=int):
        f.write("%s %d\n" % (code, counts[code]))
EOF
