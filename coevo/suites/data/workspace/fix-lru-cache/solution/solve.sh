#!/bin/bash
set -e
python - <<'EOF'
p = "/app/lru.py"
s = open(p).read()
old_get = "            return default\n        return self._data[key]\n"
new_get = "            return default\n        self._data.move_to_end(key)\n        return self._data[key]\n"
old_put = "        if key in self._data:\n            self._data[key] = value\n"
new_put = "        if key in self._data:\n            self._data[key] = value\n            self._data.move_to_end(key)\n"
assert old_get in s and old_put in s
s = s.replace(old_get, new_get).replace(old_put, new_put)
open(p, "w").write(s)
EOF
