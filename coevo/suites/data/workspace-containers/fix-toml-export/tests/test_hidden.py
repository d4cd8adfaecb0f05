"""Hidden tests: export_config.py on settings it has not seen, checked against tomli_w's own
output (the package the image installs) and read back with tomllib."""

import json
import subprocess
import sys
import tempfile
import tomllib
import unittest
from pathlib import Path

import tomli_w

SCRIPT = "/app/export_config.py"
DATA = Path(__file__).parent / "data"


def without_nulls(value):
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value if v is not None]
    return value


class ExportConfig(unittest.TestCase):
    def export(self, source):
        with tempfile.TemporaryDirectory() as tmp:
            target = Path(tmp) / "out.toml"
            proc = subprocess.run(
                [sys.executable, SCRIPT, str(source), str(target)],
                capture_output=True,
                text=True,
                timeout=30,
            )
            self.assertEqual(proc.returncode, 0, proc.stderr)
            return target.read_bytes()

    def check(self, source):
        data = without_nulls(json.loads(Path(source).read_text()))
        written = self.export(source)
        self.assertEqual(tomllib.loads(written.decode()), data)
        self.assertEqual(written.decode(), tomli_w.dumps(data))

    def test_sample(self):
        self.check("/app/settings.json")

    def test_nested_nulls(self):
        self.check(DATA / "ledger.json")

    def test_flat_and_empty_tables(self):
        self.check(DATA / "flat.json")

    def test_settings_toml_was_written(self):
        data = without_nulls(json.loads(Path("/app/settings.json").read_text()))
        self.assertEqual(Path("/app/settings.toml").read_text(), tomli_w.dumps(data))


if __name__ == "__main__":
    unittest.main(verbosity=2)
