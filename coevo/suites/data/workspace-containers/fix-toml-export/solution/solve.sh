#!/bin/bash
# tomli_w writes bytes (open the target "wb"); drop nulls inside lists too, and from the
# tables they hold.
set -euo pipefail
cd /app
python3 - <<'PY'
from pathlib import Path

path = Path("export_config.py")
text = path.read_text()
text = text.replace(
    "        return {key: toml_ready(item) for key, item in value.items() if item is not None}\n"
    "    return value\n",
    "        return {key: toml_ready(item) for key, item in value.items() if item is not None}\n"
    "    if isinstance(value, list):\n"
    "        return [toml_ready(item) for item in value if item is not None]\n"
    "    return value\n",
)
text = text.replace('with open(target, "w") as f:', 'with open(target, "wb") as f:')
path.write_text(text)
PY
python3 export_config.py settings.json settings.toml
