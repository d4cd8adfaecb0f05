#!/bin/bash
set -e
cd /app
python - <<'EOF'
import json
import re
p = "config/settings.json"
text = re.sub(r",(\s*[}\]])", r"\1", open(p).read())
data = json.loads(text)
data["port"] = 8080
with open(p, "w") as f:
    json.dump(data, f, indent=2)
    f.write("\n")
EOF
