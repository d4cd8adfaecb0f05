import json
import subprocess
import sys
from pathlib import Path

import pytest

EXPECTED = {"app_name": "inventory-api", "host": "0.0.0.0", "port": 8080, "debug": False, "workers": 4, "database": {"name": "inventory", "user": "svc_inventory", "pool_size": 5}, "allowed_origins": ["https://example.com", "https://admin.example.com"]}


def load():
    return json.loads(Path("/app/config/settings.json").read_text())


def test_valid_json():
    assert isinstance(load(), dict)


def test_port():
    port = load()["port"]
    assert port == 8080 and type(port) is int


@pytest.mark.parametrize("key", [k for k in EXPECTED if k != "port"])
def test_unchanged(key):
    assert load()[key] == EXPECTED[key]
    assert type(load()[key]) is type(EXPECTED[key])


def test_no_extra_keys():
    assert set(load()) == set(EXPECTED)


def test_app_starts():
    proc = subprocess.run([sys.executable, "/app/app.py"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0
    assert "starting inventory-api on 0.0.0.0:8080" in proc.stdout
