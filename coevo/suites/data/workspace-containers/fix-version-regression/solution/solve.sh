#!/bin/bash
# The last commit compared the versions as strings ("1.10.0" < "1.9.0"): compare the parsed
# tuples again, add the regression test, and commit on top of the history.
set -euo pipefail
cd /app/project
python3 - <<'PY'
from pathlib import Path

path = Path("pkgver/version.py")
text = path.read_text()
text = text.replace(
    "    # No need to build tuples: the cores are compared directly.\n"
    "    return _core(candidate) > _core(current)\n",
    "    return parse_version(candidate) > parse_version(current)\n",
)
text = text.replace('\n\ndef _core(text):\n    return text.strip().removeprefix("v").split("-", 1)[0]\n', "")
path.write_text(text)

tests = Path("tests/test_version.py")
tests.write_text(
    tests.read_text().replace(
        '        self.assertFalse(is_newer("v1.4.2", "1.4.2"))\n',
        '        self.assertFalse(is_newer("v1.4.2", "1.4.2"))\n'
        "\n"
        "    def test_more_digits(self):\n"
        '        self.assertTrue(is_newer("1.10.0", "1.9.0"))\n'
        '        self.assertFalse(is_newer("1.9.9", "1.10.0"))\n',
    )
)
PY
python3 -m unittest discover -s tests -t . >/dev/null 2>&1
git add pkgver/version.py tests/test_version.py
git commit -q -m "Fix is_newer for versions with multi-digit parts"
