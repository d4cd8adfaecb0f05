import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path("/tests/data")
EXPECTED = json.loads((DATA / "expected.json").read_text())
KEYS = ["rows", "total_units", "total_revenue", "revenue_by_region", "top_product"]
_cache = {}


def run_script(name, tmp_root):
    if name not in _cache:
        src = tmp_root / name
        shutil.copy(DATA / name, src)
        out = tmp_root / (name + ".json")
        proc = subprocess.run([sys.executable, "/app/summarize.py", str(src), str(out)],
                              cwd="/app", capture_output=True, text=True, timeout=30)
        _cache[name] = json.loads(out.read_text()) if proc.returncode == 0 and out.exists() else None
    return _cache[name]


def same(value, expected):
    if isinstance(expected, dict):
        return (isinstance(value, dict) and set(value) == set(expected)
                and all(same(value[k], expected[k]) for k in expected))
    if isinstance(expected, float) or (isinstance(expected, int) and isinstance(value, float)):
        return isinstance(value, (int, float)) and abs(value - expected) < 0.006
    return value == expected and type(value) is type(expected)


@pytest.fixture(scope="module")
def tmp_root(tmp_path_factory):
    return tmp_path_factory.mktemp("summaries")


@pytest.mark.parametrize("name", ["sales.csv", "hidden.csv", "empty.csv"])
@pytest.mark.parametrize("key", KEYS)
def test_field(name, key, tmp_root):
    result = run_script(name, tmp_root)
    assert result is not None, "script failed"
    assert key in result
    assert same(result[key], EXPECTED[name][key]), (result[key], EXPECTED[name][key])


def test_no_extra_keys(tmp_root):
    result = run_script("hidden.csv", tmp_root)
    assert result is not None and set(result) == set(KEYS)


def test_summary_json_written():
    result = json.loads(Path("/app/summary.json").read_text())
    assert set(result) == set(KEYS)
    assert all(same(result[k], EXPECTED["sales.csv"][k]) for k in KEYS)
