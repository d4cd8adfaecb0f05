#!/bin/bash
set -e
python - <<'EOF'
p = "/app/slug.py"
s = open(p).read()
old = '    text = re.sub(r"[^a-z0-9]", "-", text)\n    return text[:max_length]\n'
new = ('    text = re.sub(r"[^a-z0-9]+", "-", text).strip("-")\n'
       '    return text[:max_length].rstrip("-")\n')
assert old in s
open(p, "w").write(s.replace(old, new))
EOF
