#!/bin/bash
set -e
cd /app
python - <<'EOF'
import csv
import json
users = json.load(open("users.json"))
with open("active_users.csv", "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["id", "name", "email"])
    for u in sorted((u for u in users if u["active"]), key=lambda u: u["id"]):
        w.writerow([u["id"], u["name"], u["email"]])
EOF
